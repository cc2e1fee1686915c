"""How a command line names a run config: ``CONFIG [--set KEY=VALUE ...]``, the same for every
command that reads one (train, plan, retrain, import, config)."""

from __future__ import annotations

import argparse

__all__ = ["add_config_arguments"]


def add_config_arguments(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """``CONFIG [--set KEY=VALUE ...]`` (``optional``: CONFIG may be left out)."""
    p.add_argument(
        "config",
        metavar="CONFIG",
        nargs="?" if optional else None,
        help="run config, a YAML file (see configs/)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key, e.g. --set table.dim=32 (repeatable; values are YAML)",
    )

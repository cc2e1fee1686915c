"""``daskhps retrain CONFIG [--rollback VERSION | --versions | --dry-run | --follow]``: the
command line of the retraining job (``pipelines/retrain.py``); its exit codes are
:class:`ExitCode`."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from daskhps.config.arguments import add_config_arguments
from daskhps.config.runconfig import load_config
from daskhps.errors import ConfigError
from daskhps.retrain.codes import EXIT_CODES_HELP, ExitCode

__all__ = ["PIPELINE", "add_retrain_arguments", "run_retrain"]

PIPELINE = "pipelines.retrain"


def add_retrain_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--rollback",
        metavar="VERSION",
        help="make the published VERSION (e.g. v000002) current again, then exit",
    )
    what.add_argument(
        "--versions", action="store_true", help="list the published versions and exit"
    )
    what.add_argument(
        "--dry-run", action="store_true", help="say which days a run would use, then exit"
    )
    what.add_argument(
        "--follow",
        action="store_true",
        help="keep running: train each new complete chunk of the logs (a file renamed into "
        "place, an object, a folder with _SUCCESS) into a new published version; SIGTERM or "
        "Ctrl-C stops after the chunk in hand",
    )
    p.add_argument(
        "--max-chunks",
        type=int,
        metavar="N",
        help="with --follow: stop after N chunks (default: run until stopped)",
    )
    p.epilog = EXIT_CODES_HELP + "\n\nSee docs/retraining.md (cron, systemd timer, rollback)."
    p.formatter_class = argparse.RawDescriptionHelpFormatter


def run_retrain(args: argparse.Namespace) -> int:
    """Validate the config, then run ``pipelines.retrain.run``."""
    if args.max_chunks is not None and (not args.follow or args.max_chunks < 1):
        print(
            "daskhps retrain: error: --max-chunks takes a count of at least 1, with --follow",
            file=sys.stderr,
        )
        return ExitCode.BAD_CONFIG
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"daskhps retrain: error: {e}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    if importlib.util.find_spec("pipelines") is None or importlib.util.find_spec(PIPELINE) is None:
        print(
            "daskhps retrain: error: the retraining pipeline (pipelines/retrain.py) is not "
            f"installed; the config {args.config} is valid",
            file=sys.stderr,
        )
        return ExitCode.ERROR
    run = importlib.import_module(PIPELINE).run
    return int(
        run(
            config,
            rollback_to=args.rollback,
            list_versions=args.versions,
            dry_run=args.dry_run,
            follow=args.follow,
            max_chunks=args.max_chunks,
        )
    )

"""The names a retraining folder gives what it publishes, for the commands that must find or
leave alone a published version without being the retraining loop (``train`` never writes
there; ``serve`` and ``predict`` read the current version)::

    <run.dir>/versions/registry.json        the version registry (daskhps.retrain.versions)
    <stores>/<table>/rank-<r>/commits/version-<name>
                                            a published version's commit in every rank store
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["REGISTRY", "VERSION_PREFIX", "registry_folder"]

REGISTRY = "registry.json"
VERSION_PREFIX = "version-"  # of every published version's store commit


def registry_folder(path: str | Path) -> Path | None:
    """The folder of the version registry when ``path`` is a retraining run directory (or its
    ``versions/`` folder); None otherwise."""
    p = Path(path)
    for folder in (p / "versions", p):
        if (folder / REGISTRY).is_file():
            return folder
    return None

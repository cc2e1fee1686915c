"""Where a checkpoint's stores are: recorded relative to the checkpoint when they lie inside
its run folder, read back as an absolute path (a worker in another folder reads the same).

::

    runs/a/checkpoints/pass-000003/MANIFEST.json   "stores_dir": "../../stores"
    runs/a/stores/<table>/rank-<r>                 read as /abs/runs/a/stores
    cp -a runs/a runs/b                            runs/b's checkpoints read runs/b/stores

Stores outside the run folder (a disk of their own) are recorded absolute. Checkpoints written
before records were relative hold an absolute path inside the folder of the run that wrote
them; a copy or a move of that folder reads its own stores where it holds them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["recorded_stores_dir", "stores_of"]


def recorded_stores_dir(stores_dir: Path, run_dir: Path, folder: Path | None = None) -> str:
    """``stores_dir`` as a checkpoint of ``run_dir`` in ``folder`` (default: one of
    ``checkpoints/``) records it: relative to the checkpoint's folder when the stores lie
    inside the run folder (``../../stores``), so a copied or moved run folder reads its own
    stores; absolute otherwise (stores on a disk of their own)."""
    stores, run = Path(os.path.abspath(stores_dir)), Path(os.path.abspath(run_dir))
    if stores.is_relative_to(run):
        at = Path(os.path.abspath(folder)) if folder else run / "checkpoints" / "pass-0"
        return os.path.relpath(stores, at)
    return str(stores)


# The folders whose entries are checkpoints, inside a run folder: a training run's
# checkpoints, and a retraining folder's published versions.
_RUN_FOLDERS = ("checkpoints", "versions")


def stores_of(folder: Path, recorded: Path, run_config: dict[str, Any]) -> Path:
    """The stores a checkpoint in ``folder`` reads, as an absolute path (a worker in another
    folder reads the same): a relative record is beside the checkpoint, wherever it lies now.

    An absolute record inside the folder of the run that wrote it (checkpoints made before
    records were relative) is read in the run folder the checkpoint lies in now, when that
    is another one (copied or moved) and holds those stores: the copy's, never the
    original's. The folder that wrote it is the config's ``run.dir``, or (the default
    layout, ``<run.dir>/stores``, or a retraining folder's ``<run.dir>/stores/<attempt>``)
    the folder holding the stores."""
    folder = Path(os.path.abspath(folder))
    if not recorded.is_absolute():
        return Path(os.path.normpath(folder / recorded))
    run_now = folder.parent.parent
    if folder.parent.name not in _RUN_FOLDERS or recorded.is_relative_to(run_now):
        return recorded
    was = (run_config.get("run") or {}).get("dir") if isinstance(run_config, dict) else None
    writers = [Path(os.path.abspath(was))] if isinstance(was, str) else []
    for run_then in [*writers, recorded.parent, recorded.parent.parent]:
        if run_then != run_now and recorded.is_relative_to(run_then):
            here = run_now / recorded.relative_to(run_then)
            if here.is_dir():
                return here
    return recorded

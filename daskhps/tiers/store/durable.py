"""Files made durable, and their bytes checked: what every writer of a run's folders uses.

A file is durable once its bytes are fsynced and the folder that names it is fsynced too (a
new, renamed or removed entry lives in the folder). Store segments, index snapshots, commit
manifests, checkpoints and imports all go through these.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["file_sha256", "fsync_dir", "fsync_tree"]


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in blocks of 1 MiB."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fsync_dir(directory: Path) -> None:
    """Make the entries of ``directory`` (new, renamed or removed files) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(directory: Path) -> None:
    """fsync every file and folder under ``directory``, then ``directory`` itself."""
    for root, _, files in os.walk(directory, topdown=False):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(root))

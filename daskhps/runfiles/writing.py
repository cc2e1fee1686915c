"""Writing a checkpoint folder, in the order that keeps a crash harmless: an empty folder,
the payload (``dense.pt``, ``state.json``), the stores' commits (the caller's), then
``MANIFEST.json`` last, fsynced and renamed into place: only then does the checkpoint exist.
Removing one takes its manifest first, so a crash part-way leaves a torn folder that is never
loaded. The trainer's checkpointer, ``daskhps import`` and publishing write through here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from daskhps._version import __version__
from daskhps.errors import CheckpointError
from daskhps.runfiles.checkpoint import DENSE, MANIFEST, STATE, Checkpoint, checkpoints_dir
from daskhps.runfiles.manifest import FORMAT, ManifestError
from daskhps.tiers.store.durable import fsync_dir

__all__ = ["finish_checkpoint", "remove_checkpoint", "start_checkpoint", "write_payload"]


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` (a separate function so tests can inject a full disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_file(path: Path, data: bytes) -> dict[str, Any]:
    """Write ``path`` durably through a ``.tmp`` file and a rename; its size and sha256."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def remove_checkpoint(folder: Path) -> None:
    """Delete a checkpoint: its manifest first, so a crash part-way leaves a torn folder
    (never loaded), not a checkpoint with missing files."""
    if (folder / MANIFEST).exists():
        (folder / MANIFEST).unlink()
        fsync_dir(folder)
    shutil.rmtree(folder, ignore_errors=True)


def start_checkpoint(run_dir: str | os.PathLike[str], name: str) -> Path:
    """An empty folder for checkpoint ``name`` (a torn or superseded one there is removed)."""
    folder = checkpoints_dir(run_dir) / name
    if folder.exists():
        remove_checkpoint(folder)
    folder.mkdir(parents=True)
    fsync_dir(folder.parent)
    return folder


def write_payload(
    folder: Path,
    *,
    model: dict[str, torch.Tensor],
    optimizer: dict[str, Any],
    rng: list[torch.Tensor],
    state: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """Write ``dense.pt`` and ``state.json``; returns their sizes and sha256 sums."""
    import io

    buf = io.BytesIO()
    torch.save({"model": model, "optimizer": optimizer, "rng": rng}, buf)
    try:
        files = {DENSE: _write_file(folder / DENSE, buf.getvalue())}
        files[STATE] = _write_file(folder / STATE, json.dumps(state, indent=1).encode())
    except OSError as e:
        raise CheckpointError(
            f"writing checkpoint {folder} failed: {e}; nothing of it is visible and earlier "
            "checkpoints are intact: free disk space, then resume with --resume"
        ) from e
    return files


def finish_checkpoint(
    folder: Path, files: dict[str, dict[str, Any]], fields: dict[str, Any]
) -> Checkpoint:
    """Write ``MANIFEST.json`` last (fsync, atomic rename): the checkpoint becomes visible.

    ``fields`` holds everything but ``format``, ``daskhps_version``, ``name``, ``created`` and
    ``files``, which are filled in here.
    """
    manifest = {
        "format": FORMAT if fields.get("tables") else 1,
        "daskhps_version": __version__,
        "name": folder.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **fields,
        "files": files,
    }
    try:
        ckpt = Checkpoint.at(folder, manifest)
    except ManifestError as e:
        raise CheckpointError(f"checkpoint {folder}: the manifest {e}") from None
    try:
        _write_file(folder / MANIFEST, json.dumps(manifest, indent=1).encode())
        fsync_dir(folder)
    except OSError as e:
        raise CheckpointError(
            f"writing {folder / MANIFEST} failed: {e}; the checkpoint is not visible and "
            "earlier ones are intact: free disk space, then resume with --resume"
        ) from e
    return ckpt

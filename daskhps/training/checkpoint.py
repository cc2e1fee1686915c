"""Checkpoints of a training run on disk: what one holds, how it becomes visible, how to find it.

::

    <run.dir>/checkpoints/
      pass-000002/                 <name> = passes of the run completed when it was taken
        dense.pt                   torch.save({"model", "optimizer", "rng"}), weights_only
        state.json                 plan position (epoch, pass, step), the pass's metrics
        MANIFEST.json              written last (fsync, atomic rename): the checkpoint exists
      pass-000003/ ...

The table's rows are not copied: every shard store ``<stores_dir>/<table>/rank-<r>`` holds a
commit point named like the checkpoint (``commit``), and a store's commit costs only the rows
written since its previous one. A folder without ``MANIFEST.json``, or whose files do not
match the sizes and sha256 sums it records, is never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from daskhps import __version__
from daskhps.errors import CheckpointError
from daskhps.table.table import open_store
from daskhps.tiers._segments import fsync_dir
from daskhps.tiers.zarr_store import ZarrStore

if TYPE_CHECKING:
    from daskhps.config import RunConfig
    from daskhps.table import TableSpec

__all__ = [
    "DENSE",
    "FORMAT",
    "MANIFEST",
    "STATE",
    "Checkpoint",
    "checkpoint_name",
    "checkpoints_dir",
    "find_checkpoint",
    "finish_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "remove_checkpoint",
    "start_checkpoint",
    "write_payload",
]

FORMAT = 1
MANIFEST = "MANIFEST.json"
DENSE = "dense.pt"
STATE = "state.json"
_NAME = re.compile(r"^pass-(\d{6,})$")
_REQUIRED: tuple[str, ...] = (
    *("format", "name", "kind", "passes_done", "step", "commit", "stores_dir"),
    *("num_workers", "num_shards", "table", "config", "files"),
)


def checkpoint_name(passes_done: int) -> str:
    """``pass-000012``: the name of the checkpoint taken after ``passes_done`` passes."""
    return f"pass-{passes_done:06d}"


def checkpoints_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / "checkpoints"


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint: its folder and its verified manifest.

    Serving needs nothing else: the stores (:attr:`stores_dir`, opened read-only at
    :attr:`commit`), the routing (``ShardMap(num_shards, num_workers)``), the dense model
    (``config.model`` + :meth:`dense_state`).
    """

    path: Path
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    @property
    def kind(self) -> str:
        """``"base"`` (stores compacted, full index snapshot) or ``"delta"``."""
        return str(self.manifest["kind"])

    @property
    def passes_done(self) -> int:
        return int(self.manifest["passes_done"])

    @property
    def step(self) -> int:
        """Optimizer steps taken (the LR schedule's position)."""
        return int(self.manifest["step"])

    @property
    def commit(self) -> str:
        return str(self.manifest["commit"])

    @property
    def stores_dir(self) -> Path:
        return Path(self.manifest["stores_dir"])

    @property
    def num_workers(self) -> int:
        return int(self.manifest["num_workers"])

    @property
    def num_shards(self) -> int:
        return int(self.manifest["num_shards"])

    @property
    def metrics(self) -> dict[str, Any]:
        return dict(self.manifest.get("metrics") or {})

    @property
    def config(self) -> RunConfig:
        from daskhps.config import RunConfig

        return RunConfig.from_dict(self.manifest["config"], source=str(self.path / MANIFEST))

    @property
    def table_spec(self) -> TableSpec:
        """The table's spec; its layout is the one the stores were written with."""
        spec = self.config.table_spec()
        if spec.layout() != self.manifest["table"]:
            raise CheckpointError(
                f"checkpoint {self.path}: the table layout in {MANIFEST} "
                f"({self.manifest['table']}) differs from its config's ({spec.layout()}); "
                "the manifest was edited by hand: restore it or use another checkpoint"
            )
        return spec

    def store_path(self, rank: int, table: str | None = None) -> Path:
        """The store of rank ``rank``'s shard of ``table`` (default: the run's table)."""
        return self.stores_dir / (table or str(self.manifest["table"]["table"])) / f"rank-{rank}"

    def open_store(self, rank: int, mode: Literal["r", "r+"] = "r") -> ZarrStore:
        """Rank ``rank``'s store of the run's table, at this checkpoint's commit."""
        return open_store(self.table_spec, self.store_path(rank), mode=mode, commit=self.commit)

    def state(self) -> dict[str, Any]:
        """``state.json``: plan position (``epoch``, ``pass``, ``step``) and the pass record."""
        return dict(json.loads((self.path / STATE).read_text()))

    def _dense(self) -> dict[str, Any]:
        try:
            out = torch.load(self.path / DENSE, map_location="cpu", weights_only=True)
        except Exception as e:  # unpickling errors have many types
            raise CheckpointError(f"checkpoint {self.path}: cannot read {DENSE}: {e}") from e
        if not isinstance(out, dict) or "model" not in out or "optimizer" not in out:
            raise CheckpointError(
                f"checkpoint {self.path}: {DENSE} lacks 'model' or 'optimizer'; it was not "
                "written by daskhps: use another checkpoint"
            )
        return out

    def dense_state(self) -> dict[str, torch.Tensor]:
        """The dense model's ``state_dict``."""
        return dict(self._dense()["model"])

    def optimizer_state(self) -> dict[str, Any]:
        """The dense optimizer's ``state_dict``."""
        return dict(self._dense()["optimizer"])

    def rng_states(self) -> list[torch.Tensor]:
        """Each rank's torch CPU RNG state when the checkpoint was taken (rank order)."""
        return list(self._dense().get("rng", []))


# -- reading ------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _verify(folder: Path) -> Checkpoint:
    """The checkpoint in ``folder``, or :class:`CheckpointError` saying what is wrong."""
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(
            f"{folder} has no {MANIFEST}: it is not a checkpoint, or one whose writing never "
            "finished (such a folder is never loaded); use an earlier checkpoint"
        )
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{mpath} is unreadable ({e}); use an earlier checkpoint") from e
    missing = [k for k in _REQUIRED if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise CheckpointError(f"{mpath} lacks {missing}; use an earlier checkpoint")
    if not isinstance(manifest["format"], int) or manifest["format"] > FORMAT:
        raise CheckpointError(
            f"{mpath}: checkpoint format {manifest['format']!r} is newer than this daskhps "
            f"reads ({FORMAT}; written by daskhps {manifest.get('daskhps_version')}); upgrade"
        )
    for fname, info in manifest["files"].items():
        p = folder / fname
        if not p.is_file() or p.stat().st_size != info["size"] or _sha256(p) != info["sha256"]:
            raise CheckpointError(
                f"checkpoint {folder}: {fname} is missing or does not match {MANIFEST} (size "
                f"or sha256 differ): the checkpoint is damaged; use an earlier one"
            )
    return Checkpoint(folder, manifest)


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[Checkpoint]:
    """The complete, verified checkpoints of a run, oldest first (torn ones are skipped)."""
    folder = checkpoints_dir(run_dir)
    if not folder.is_dir():
        return []
    out = []
    for entry in sorted(os.listdir(folder)):
        if _NAME.match(entry) and (folder / entry / MANIFEST).is_file():
            try:
                out.append(_verify(folder / entry))
            except CheckpointError:
                continue  # damaged: never loaded, an earlier one serves
    return sorted(out, key=lambda c: c.passes_done)


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Checkpoint | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def find_checkpoint(run_dir: str | os.PathLike[str], name: str) -> Checkpoint:
    """Checkpoint ``name`` (e.g. ``pass-000003``) of the run in ``run_dir``, verified;
    :class:`CheckpointError` naming the complete ones when it is missing or damaged."""
    folder = checkpoints_dir(run_dir) / name
    if not folder.is_dir():
        found = [c.name for c in list_checkpoints(run_dir)]
        raise CheckpointError(
            f"{run_dir} has no checkpoint {name!r}; its complete checkpoints: "
            + (", ".join(found) if found else "none")
        )
    return _verify(folder)


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """A checkpoint folder, or a run directory (its latest complete checkpoint)."""
    p = Path(path)
    if (p / MANIFEST).exists() or _NAME.match(p.name):
        return _verify(p)
    if checkpoints_dir(p).is_dir() or (p / "config.yaml").is_file():
        latest = latest_checkpoint(p)
        if latest is None:
            raise CheckpointError(
                f"run directory {p} has no complete checkpoint in {checkpoints_dir(p)}; "
                "train with checkpoint.every_passes >= 1 first"
            )
        return latest
    if not p.exists():
        raise CheckpointError(f"{p} does not exist; give a checkpoint folder or a run directory")
    raise CheckpointError(
        f"{p} is neither a checkpoint (no {MANIFEST}) nor a run directory (no checkpoints/); "
        "give <run.dir> or <run.dir>/checkpoints/pass-NNNNNN"
    )


# -- writing (the trainer's side; crash-safe order: payload, store commits, manifest) ------


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
        "format": FORMAT,
        "daskhps_version": __version__,
        "name": folder.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **fields,
        "files": files,
    }
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise CheckpointError(f"checkpoint {folder}: manifest fields {missing} not given")
    try:
        _write_file(folder / MANIFEST, json.dumps(manifest, indent=1).encode())
        fsync_dir(folder)
    except OSError as e:
        raise CheckpointError(
            f"writing {folder / MANIFEST} failed: {e}; the checkpoint is not visible and "
            "earlier ones are intact: free disk space, then resume with --resume"
        ) from e
    return Checkpoint(folder, manifest)

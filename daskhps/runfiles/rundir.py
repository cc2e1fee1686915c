"""What a run directory holds, and the rules that keep a trained model when a new run starts.

The rules, as ``daskhps train`` applies them before it touches anything::

    run.dir holds no run                    train
    run.dir holds a run                     refuse, naming --resume and --overwrite
      --resume [--checkpoint NAME]          continue from that (default: the latest) checkpoint;
                                            an earlier one than the latest also needs
                                            --overwrite, and the later ones are discarded
      --overwrite                           move the earlier run aside, train, and delete it
                                            once the new run's first checkpoint is complete
                                            (without checkpoints: once the run ends); a failure
                                            before that puts the earlier run back
    run.dir or the stores hold published    refuse always: only ``daskhps retrain`` and its
      versions (a retraining folder)        retention rules may touch them

"A run" is anything training leaves that is worth keeping: a checkpoint folder, a non-empty
``metrics.jsonl``, ``summary.json``, or table stores under ``table.tiers.store_dir``. A folder
with only ``config.yaml`` (a run that failed before it trained) holds no run.

Moving aside is a rename on the same file system, so it costs no disk; the earlier run stays
on disk until the new run's first checkpoint, which is why ``--overwrite`` checks that the
disk has room for both. Where each entry went is written to ``.previous-run/ASIDE.json``
before the first rename, so a run killed part-way is put right by the next ``train``:
:func:`settle_interrupted` restores the earlier run when the new one left no complete
checkpoint, and finishes the deletion when it did.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from daskhps._paths import free_bytes, tree_bytes
from daskhps.errors import ConfigError, RunExistsError
from daskhps.runfiles.checkpoint import _NAME, checkpoints_dir, list_checkpoints
from daskhps.runfiles.published import REGISTRY, VERSION_PREFIX, registry_folder
from daskhps.tiers.store.manifest import scan_manifests

__all__ = [
    "ASIDE",
    "EarlierRun",
    "MovedAside",
    "find_earlier_run",
    "move_aside",
    "published_commits",
    "refuse_published",
    "settle_interrupted",
]

log = logging.getLogger(__name__)

ASIDE = ".previous-run"  # inside run.dir: the earlier run's files while a new run replaces it
_RECORD = "ASIDE.json"
_RUN_FILES = ("metrics.jsonl", "summary.json", "config.yaml", "report")


def _store_dirs(store_dir: Path) -> list[Path]:
    """The config's stores and the re-sharded stores a resume made beside them."""
    return [store_dir, *sorted(store_dir.parent.glob(f"{store_dir.name}-resharded-*"))]


def _non_empty(path: Path) -> bool:
    if path.is_dir():
        return any(path.iterdir())
    return path.is_file() and path.stat().st_size > 0


@dataclass(frozen=True)
class EarlierRun:
    """What an earlier run left in a run directory and its stores."""

    run_dir: Path
    checkpoints: list[str]  # folder names, complete or not, oldest first
    complete: list[str]  # the complete, verified ones among them
    files: list[Path]  # run.dir entries other than checkpoints/
    stores: list[Path]  # non-empty store folders

    @property
    def paths(self) -> list[Path]:
        found = [*self.files, *self.stores]
        if self.checkpoints:
            found.append(checkpoints_dir(self.run_dir))
        return found

    def bytes(self) -> int:
        return sum(tree_bytes(p) for p in self.paths)

    def describe(self) -> str:
        if self.complete:
            n = len(self.complete)
            what = f"{n} checkpoint{'s' if n != 1 else ''} (latest {self.complete[-1]})"
        elif self.checkpoints:
            what = "no complete checkpoint"
        else:
            what = "no checkpoint"
        if self.stores:
            what += ", table stores in " + ", ".join(str(s) for s in self.stores)
        return what


def find_earlier_run(run_dir: str | Path, store_dir: str | Path) -> EarlierRun | None:
    """What an earlier run left in ``run_dir`` and ``store_dir``; None when nothing."""
    run_dir, store_dir = Path(run_dir), Path(store_dir)
    ckdir = checkpoints_dir(run_dir)
    names = sorted(e for e in os.listdir(ckdir) if _NAME.match(e)) if ckdir.is_dir() else []
    files = [
        run_dir / f
        for f in _RUN_FILES
        if f != "config.yaml" and _non_empty(run_dir / f)  # config.yaml alone: nothing trained
    ]
    stores = [s for s in _store_dirs(store_dir) if _non_empty(s)]
    if not (names or files or stores):
        return None
    if (run_dir / "config.yaml").is_file():
        files.append(run_dir / "config.yaml")
    complete = [c.name for c in list_checkpoints(run_dir)]
    return EarlierRun(run_dir, names, complete, files, stores)


def training_run_files(run_dir: str | Path) -> list[str]:
    """The entries of ``run_dir`` that only ``daskhps train`` makes (its checkpoints, its
    metrics and summary): what tells a training run from a retraining folder, whose
    checkpoints live in ``attempts/`` and ``versions/``."""
    run_dir = Path(run_dir)
    found = ["checkpoints/"] if _non_empty(checkpoints_dir(run_dir)) else []
    return found + [f for f in ("metrics.jsonl", "summary.json") if _non_empty(run_dir / f)]


def published_commits(store_dir: str | Path) -> list[str]:
    """Names of the published-version commits in any rank store under ``store_dir``."""
    found: set[str] = set()
    for s in _store_dirs(Path(store_dir)):
        for commits in s.glob("*/rank-*/commits"):
            good, _ = scan_manifests(commits)
            found.update(m.name for m in good if m.name.startswith(VERSION_PREFIX))
    return sorted(found)


def refuse_published(run_dir: str | Path, store_dir: str | Path | None, source: str) -> None:
    """:class:`RunExistsError` when ``run_dir`` is a retraining folder or the stores hold
    published versions: ``train`` would otherwise remove or rewrite what they refer to
    (``store_dir`` None: the stores are on a cluster's workers, not read here)."""
    registry = registry_folder(run_dir)
    if registry is not None:
        raise RunExistsError(
            f"{source}: {run_dir} is a retraining folder ({registry / REGISTRY} lists "
            "its published versions); daskhps train never writes there: run daskhps retrain "
            "with that folder's retraining config to train and publish, or set run.dir to "
            "another folder"
        )
    versions = published_commits(store_dir) if store_dir is not None else []
    if versions:
        raise RunExistsError(
            f"{source}: the stores in {store_dir} hold published versions ({', '.join(versions)})"
            "; daskhps train never writes there: run `daskhps retrain` to train and publish, or "
            "set table.tiers.store_dir to another folder"
        )


@dataclass
class MovedAside:
    """An earlier run moved aside while a new run replaces it (see the module docstring)."""

    folder: Path  # run.dir/.previous-run
    moves: list[tuple[Path, Path]] = field(default_factory=list)  # (original, aside)

    def restore(self) -> None:
        """Put the earlier run back: what the new run wrote in its place is removed first."""
        for original, aside in reversed(self.moves):
            if not aside.exists():
                continue  # never moved (a kill between the record and the rename)
            if original.exists() or original.is_symlink():
                _remove(original)
            os.replace(aside, original)
        shutil.rmtree(self.folder, ignore_errors=True)
        log.warning("the new run failed before its first checkpoint: the earlier run is back")

    def discard(self) -> None:
        """Delete the earlier run: the new run has a complete checkpoint."""
        for _, aside in self.moves:
            if aside.exists():
                _remove(aside)
        shutil.rmtree(self.folder, ignore_errors=True)
        log.info("deleted the earlier run that --overwrite replaced")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _aside_path(folder: Path, run_dir: Path, original: Path) -> Path:
    """Inside ``folder`` when ``original`` lives in run.dir; else beside ``original``, so the
    rename stays on its file system (stores are often on another disk)."""
    if original.parent == run_dir:
        return folder / original.name
    return original.parent / f".{original.name}{ASIDE}"


def move_aside(earlier: EarlierRun, needed_bytes: int | None, source: str) -> MovedAside:
    """Move ``earlier``'s files aside; :class:`RunExistsError` when the disk cannot hold both
    runs until the new run's first checkpoint (``needed_bytes``: the new run's estimate; None:
    as much as the earlier run takes)."""
    where, free = free_bytes(earlier.run_dir)
    need = needed_bytes if needed_bytes is not None else earlier.bytes()
    if need > free:
        raise RunExistsError(
            f"{source}: --overwrite keeps the earlier run in {earlier.run_dir} until the new "
            f"run's first checkpoint, and the disk cannot hold both: about {need >> 20} MiB "
            f"needed, {free >> 20} MiB free on {where}; free disk space, or delete the earlier "
            "run yourself"
        )
    folder = earlier.run_dir / ASIDE
    folder.mkdir(parents=True, exist_ok=True)
    moved = MovedAside(
        folder, [(p, _aside_path(folder, earlier.run_dir, p)) for p in earlier.paths]
    )
    recorded = False
    try:
        for _, aside in moved.moves:
            if aside.exists():
                _remove(aside)  # a stale copy of an earlier, settled overwrite
        _write_record(moved)  # before the first rename: a kill part-way is settled next time
        recorded = True
        for original, aside in moved.moves:
            os.replace(original, aside)
    except BaseException:
        # Ctrl-C (or a failed rename) part-way: the caller never gets ``moved`` to restore,
        # so put back here what was moved. Before the record nothing was moved: the folder
        # (and a record written just before the interrupt) is all there is to remove.
        if recorded:
            moved.restore()
        else:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return moved


def _write_record(moved: MovedAside) -> None:
    tmp = moved.folder / (_RECORD + ".tmp")
    tmp.write_text(json.dumps([[str(a), str(b)] for a, b in moved.moves], indent=1))
    os.replace(tmp, moved.folder / _RECORD)


def _read_record(run_dir: Path) -> MovedAside | None:
    folder = run_dir / ASIDE
    try:
        pairs = json.loads((folder / _RECORD).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"{folder / _RECORD} is unreadable ({e}): an earlier --overwrite was interrupted; "
            f"the earlier run's files are in {folder}: move them back by hand or delete them"
        ) from e
    return MovedAside(folder, [(Path(a), Path(b)) for a, b in pairs])


def settle_interrupted(run_dir: str | Path) -> None:
    """Finish an ``--overwrite`` that a kill interrupted: restore the earlier run when the new
    run has no complete checkpoint, else delete it as the new run's first checkpoint should
    have."""
    moved = _read_record(Path(run_dir))
    if moved is None:
        return
    if list_checkpoints(run_dir):
        log.warning("finishing an interrupted --overwrite: deleting the run it replaced")
        moved.discard()
    else:
        log.warning(
            "an earlier --overwrite stopped before the new run's first checkpoint: restoring "
            "the run it replaced"
        )
        moved.restore()


def non_empty_stores(store_dir: str | Path) -> bool:
    """Whether ``store_dir`` holds any table's rank store."""
    return any(Path(store_dir).glob("*/rank-*"))


@dataclass(frozen=True)
class FreshRun:
    """What a new run's folders held before it started, so that a run that fails before its
    first checkpoint can leave them as it found them (the same command then simply runs
    again, instead of finding "a run" in the folder)."""

    run_dir: Path
    store_dir: Path
    run_entries: frozenset[str] | None  # None: run.dir did not exist
    store_entries: frozenset[str] | None

    @classmethod
    def before(cls, run_dir: str | Path, store_dir: str | Path) -> FreshRun:
        def entries(p: Path) -> frozenset[str] | None:
            return frozenset(os.listdir(p)) if p.is_dir() else None

        r, s = Path(run_dir), Path(store_dir)
        return cls(r, s, entries(r), entries(s))

    def undo(self) -> None:
        """Remove what the run added to both folders (and the folders it created)."""
        for folder, had in ((self.store_dir, self.store_entries), (self.run_dir, self.run_entries)):
            if not folder.is_dir():
                continue
            if had is None:
                shutil.rmtree(folder, ignore_errors=True)
                continue
            for name in set(os.listdir(folder)) - had:
                _remove(folder / name)
        log.info("the run failed before its first checkpoint: %s is as it was", self.run_dir)


def ensure_no_run_dir_clash(run_dir: Path, store_dir: Path) -> None:
    """The stores must not be run.dir itself or hold it (an aside move would take both)."""
    r, s = run_dir.absolute(), store_dir.absolute()
    if r == s or r.is_relative_to(s):
        raise ConfigError(
            f"table.tiers.store_dir {store_dir} holds run.dir {run_dir}; give the stores their "
            "own folder (the default is <run.dir>/stores)"
        )

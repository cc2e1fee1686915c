"""A second copy of a run's checkpoints at ``checkpoint.replicate_to``: a shared folder or an
fsspec URL (``file://``, object storage), so a checkpoint outlives the disk of the worker that
holds a shard of it.

::

    <replicate_to>/
      checkpoints/pass-000004/     dense.pt, state.json, MANIFEST.json (its stores_dir is
                                   ../../stores/<name>: the copy loads where it lies)
      stores/<name>/<table>/rank-<r>/   a mirror of each rank's shard store of every table
                                   (<name>: the folder name of the stores the checkpoint reads)

After each local checkpoint is complete, every rank mirrors its store (store files never
change once written, so only the files new since the last copy travel: a delta checkpoint
costs its delta), the checkpoint's files follow and ``MANIFEST.json`` comes last, so a copy
cut short is never loaded. Only then are the copy's files that the local stores dropped
removed. A rank store that is missing or damaged when a run resumes or recovers is restored
from the copy; ``inspect``, ``predict``, ``export`` and ``serve`` read the copy where it lies
when a checkpoint's stores are not on their machine, or damaged
(:mod:`daskhps.runfiles.reading`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsspec.implementations.local import LocalFileSystem

from daskhps import storage
from daskhps._paths import writing_problem
from daskhps.errors import CheckpointError, ConfigError
from daskhps.runfiles.checkpoint import (
    MANIFEST,
    Checkpoint,
    Skipped,
    check_checkpoint,
)
from daskhps.tiers.store.check import StoreChecker

if TYPE_CHECKING:
    from daskhps.config import RunConfig

__all__ = ["KEY", "Copied", "Replica", "mirror_shards", "restore_stores"]

log = logging.getLogger(__name__)

KEY = "checkpoint.replicate_to"
_LAST = ("commits", "zarr.json")  # a store's files made visible last, in this order
_SKIP = ("LOCK",)  # the writer's lock: local to the writer


@dataclass
class Copied:
    """What one copy moved."""

    files: int = 0
    bytes: int = 0
    removed: int = 0

    def add(self, other: Copied) -> None:
        self.files += other.files
        self.bytes += other.bytes
        self.removed += other.removed


class Replica:
    """The copy of one run's checkpoints at ``url`` (a path or an fsspec URL)."""

    def __init__(self, url: str) -> None:
        self.url = url
        # Its protocol was checked with the config (checkpoint.replicate_to).
        self.fs, self.root = storage.url_to_fs(url)
        self.root = self.root.rstrip("/")
        if self.local and "://" not in url:  # a relative path means the driver's folder,
            self.url = os.path.abspath(url)  # also on workers started in other folders

    @classmethod
    def of(cls, config: RunConfig) -> Replica | None:
        """The copy of ``config``'s run (``checkpoint.replicate_to``); None without one."""
        url = config.checkpoint.replicate_to
        return None if url is None else cls(url)

    @staticmethod
    def attempt_url(url: str, attempt: str) -> str:
        """Where retrain attempt ``attempt`` of the run copied to ``url`` keeps its copy: a
        folder of its own, so that attempts never prune each other's files."""
        return f"{url.rstrip('/')}/attempts/{attempt}"

    def __repr__(self) -> str:
        return f"Replica({self.url!r})"

    @property
    def local(self) -> bool:
        """Whether the copy is a folder of this machine (then it is read where it lies)."""
        return isinstance(self.fs, LocalFileSystem)

    def _path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def checkpoint_path(self, name: str) -> str:
        return self._path("checkpoints", name)

    def store_path(self, stores: str, table: str, rank: int) -> str:
        return self._path("stores", stores, table, f"rank-{rank}")

    # -- before a run ------------------------------------------------------------------

    def check_writable(self, source: str) -> None:
        """One line naming :data:`KEY` when the copy cannot be written (:meth:`unwritable`)."""
        problem = self.unwritable()
        if problem is not None:
            raise ConfigError(f"{source}: {KEY}: {problem}")

    def unwritable(self) -> str | None:
        """Why checkpoints cannot be written to the copy, and what to do; None: they can, and
        nothing is left. A folder is tried as every folder a run writes is
        (:func:`writing_problem`: the workers that share it may try it at once)."""
        if not self.local:
            return self._probe()
        why = writing_problem(self.root)
        return None if why is None else self._cannot_write(why)

    def _cannot_write(self, why: str) -> str:
        return (
            f"cannot write checkpoints to {self.url} ({why}); set it to a writable folder or "
            "URL, or remove it"
        )

    def _probe(self) -> str | None:
        """:meth:`unwritable` for a URL (object storage), tried with a file. A bucket that
        does not exist is refused in words of its own: it is never created."""
        probe = self._path(f".daskhps-probe-{os.getpid()}")
        try:
            storage.make_folder(self.fs, self.root)
            with self.fs.open(probe, "wb") as f:
                f.write(b"daskhps")
            self.fs.rm_file(probe)
        except Exception as e:
            # The store's own failures too: botocore's (no credentials found) are no OSError.
            if (
                not isinstance(e, (OSError, ValueError))
                and storage.transport_failure(self.url, e) is None
            ):
                raise
            if storage.no_such_bucket(self.url, e):
                return (
                    f"the bucket {storage.bucket_of(self.url)!r} of "
                    f"{storage.shown(self.url)} does not exist: create it, or set {KEY} to a "
                    "bucket that exists (daskhps creates no bucket)"
                )
            return self._cannot_write(storage.reason(self.url, e, "write"))
        return None

    # -- writing ---------------------------------------------------------------------

    def put_checkpoint(self, ckpt: Checkpoint) -> Copied:
        """Copy ``ckpt``'s files, its manifest last (pointing at the copy's stores)."""
        dest = self.checkpoint_path(ckpt.name)
        storage.make_folder(self.fs, dest)
        out = Copied()
        for name in ckpt.files:
            self.fs.put_file(str(ckpt.path / name), f"{dest}/{name}")
            out.files += 1
            out.bytes += int(ckpt.files[name]["size"])
        manifest = dict(ckpt.manifest)
        manifest["stores_dir"] = f"../../stores/{ckpt.stores_dir.name}"
        manifest["replica_of"] = str(ckpt.path)
        _put_atomic(self.fs, f"{dest}/{MANIFEST}", json.dumps(manifest, indent=2).encode())
        return out

    def has_checkpoint(self, name: str) -> bool:
        return bool(self.fs.exists(f"{self.checkpoint_path(name)}/{MANIFEST}"))

    def prune_checkpoints(self, keep: set[str]) -> int:
        """Remove the copy's checkpoints not in ``keep`` (manifest first); how many."""
        removed = 0
        for name in self._checkpoint_names():
            if name not in keep:
                folder = self.checkpoint_path(name)
                if self.fs.exists(f"{folder}/{MANIFEST}"):
                    self.fs.rm_file(f"{folder}/{MANIFEST}")
                self.fs.rm(folder, recursive=True)
                removed += 1
        return removed

    def _checkpoint_names(self) -> list[str]:
        folder = self._path("checkpoints")
        if not self.fs.exists(folder):
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(folder, detail=False))

    # -- reading -----------------------------------------------------------------------

    def local_checkpoint(self, name: str) -> Checkpoint | Skipped:
        """The copy of checkpoint ``name`` as a checkpoint of its own (its files verified),
        or why it is never loaded: where it lies when the copy is a folder of this machine,
        else as fetched into the local cache (:mod:`daskhps.runfiles.copycache`)."""
        if not self.local:
            from daskhps.runfiles.copycache import CopyCache

            return check_checkpoint(CopyCache().checkpoint(self.url, name).path)
        return check_checkpoint(Path(self.checkpoint_path(name)))

    def restore_store(self, ckpt: Checkpoint, rank: int) -> Path:
        """Put the copy of rank ``rank``'s stores of ``ckpt`` (every table's) in their local
        place; a store there that is not sound at the commit is moved aside
        (``rank-<r>.damaged-<time>``), never deleted, and a sound one is kept. Returns the
        first table's store. Raises :class:`CheckpointError` when the copy lacks one or it is
        damaged too; nothing local is changed before every needed copy is fetched and sound."""
        if not self.has_checkpoint(ckpt.name):
            raise CheckpointError(
                f"rank {rank}'s store of {ckpt.name} is not in the copy at {self.url}"
            )
        checker = StoreChecker()
        fetched = []
        try:
            for table in ckpt.table_names:
                dest = ckpt.store_path(rank, table)
                if checker.check(dest, ckpt.commit, ckpt.recorded_commits(table)[rank]).ok:
                    continue  # this table's store is sound here: only the others come back
                fetched.append((dest, self._fetch(ckpt, rank, table, dest)))
        except BaseException:
            for _, tmp in fetched:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        for dest, tmp in fetched:
            if dest.exists():
                aside = dest.with_name(f"{dest.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
                os.replace(dest, aside)
                log.warning("moved the damaged store %s aside to %s", dest, aside)
            os.replace(tmp, dest)
        return ckpt.store_path(rank)

    def _fetch(self, ckpt: Checkpoint, rank: int, table: str, dest: Path) -> Path:
        """The copy of rank ``rank``'s store of ``table``, fetched beside ``dest`` and
        checked at the checkpoint's commit; its folder."""
        src = self.store_path(ckpt.stores_dir.name, table, rank)
        which = f"rank {rank}'s store" + (f" of table {table}" if ckpt.tables else "")
        if not self.fs.exists(f"{src}/zarr.json"):
            raise CheckpointError(f"{which} of {ckpt.name} is not in the copy at {self.url}")
        tmp = dest.with_name(f".{dest.name}.restoring")
        shutil.rmtree(tmp, ignore_errors=True)  # an earlier restore cut short: ours alone
        tmp.parent.mkdir(parents=True, exist_ok=True)
        self.fs.get(src.rstrip("/") + "/", str(tmp), recursive=True)
        check = StoreChecker().check(tmp, ckpt.commit)
        if not check.ok:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"the copy at {self.url} of {which} of {ckpt.name} is damaged too: "
                f"{check.damage[0]}"
            )
        return tmp


def restore_stores(ckpt: Checkpoint, replica: Replica) -> list[str]:
    """Restore every rank's stores of ``ckpt`` (every table's) that are missing or damaged at
    its commit from ``replica``; a line for each restored rank (a copy that cannot help is
    logged and left: the caller's damage check then names the local problem)."""
    checker = StoreChecker()
    done = []
    for rank in range(ckpt.num_workers):
        bad = []
        for table in ckpt.table_names:
            path = ckpt.store_path(rank, table)
            check = checker.check(path, ckpt.commit, ckpt.recorded_commits(table)[rank])
            if not check.ok:
                bad.append((path, check))
        if not bad:
            continue
        path, check = bad[0]
        was = "damaged" if path.exists() else "missing"
        try:
            replica.restore_store(ckpt, rank)
        except (CheckpointError, OSError) as e:
            log.warning("cannot restore rank %d's store of %s: %s", rank, ckpt.name, e)
            continue
        done.append(
            f"restored rank {rank}'s store of {ckpt.name} from {replica.url} (it was {was}: "
            f"{check.damage[0]})"
        )
    return done


def mirror_store(fs: Any, local: Path, dest: str) -> Copied:
    """Copy the files of the store at ``local`` that ``dest`` lacks or holds at another size
    (store files never change once written); its commits and root metadata last."""
    have = _sizes(fs, dest)
    out = Copied()
    for rel, size in sorted(_local_files(local), key=lambda f: _order(f[0])):
        target = f"{dest}/{rel}"
        if have.get(target) == size:
            continue
        if _order(rel) > 0:  # a commit or the root: complete or absent, never half
            _put_atomic(fs, target, (local / rel).read_bytes())
        else:
            storage.make_folder(fs, target.rsplit("/", 1)[0])
            fs.put_file(str(local / rel), target)
        out.files += 1
        out.bytes += size
    return out


def prune_store(fs: Any, local: Path, dest: str) -> int:
    """Remove the files of ``dest`` the store at ``local`` no longer has (dropped commits and
    the segments only they used); how many. Run once the newer checkpoint's copy is whole."""
    keep = {f"{dest}/{rel}" for rel, _ in _local_files(local)}
    gone = [p for p in _sizes(fs, dest) if p not in keep]
    for p in sorted(gone, key=lambda p: -_order(p[len(dest) + 1 :])):  # commits first
        fs.rm_file(p)
    return len(gone)


def mirror_shards(shards: Any, url: str, prune: bool) -> Copied:
    """On a worker: mirror (or, with ``prune``, prune) this rank's store of every table into
    the copy at ``url`` (``WorkerShards`` method style, run through ``RunGroup.on_shards``)."""
    replica = Replica(url)
    out = Copied()
    stores = Path(shards.stores_dir).name
    for table in list(shards.tables):
        with shards.locked(table):  # the store is quiet: nothing writes while it is copied
            local = shards.store_path(table)
            dest = replica.store_path(stores, table, shards.rank)
            if prune:
                out.removed += prune_store(replica.fs, local, dest)
            else:
                out.add(mirror_store(replica.fs, local, dest))
    return out


def _local_files(root: Path) -> Iterator[tuple[str, int]]:
    for folder, _, files in os.walk(root):
        for name in files:
            if name in _SKIP or name.endswith(".tmp"):
                continue
            path = Path(folder) / name
            yield path.relative_to(root).as_posix(), path.stat().st_size


def _sizes(fs: Any, dest: str) -> dict[str, int]:
    """Every file under ``dest`` in the copy, by path, with its size."""
    if not fs.exists(dest):
        return {}
    found = fs.find(dest, detail=True)
    return {p: int(i.get("size") or 0) for p, i in found.items() if i.get("type") != "directory"}


def _order(rel: str) -> int:
    """0 for segments and index snapshots, then commits, then the root metadata."""
    top = rel.split("/", 1)[0]
    return _LAST.index(top) + 1 if top in _LAST else 0


def _put_atomic(fs: Any, target: str, data: bytes) -> None:
    """``target`` complete or absent: written beside it, then moved into place (a rename on
    a local or shared folder; an object store's single upload is whole by itself)."""
    storage.make_folder(fs, target.rsplit("/", 1)[0])
    if isinstance(fs, LocalFileSystem):
        tmp = f"{target}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    else:
        fs.pipe_file(target, data)

"""Version retention (``retrain.keep_versions``): old published versions go, disk stays bounded.

::

    after a publish, for every version but the newest keep_versions, CURRENT and any served:
      take its lease exclusively (no server holds it, none can start while it goes)
      drop its commit (version-vNNNNNN) in every rank store  ─► segments only it used: deleted
      delete its version folder, mark it removed in the registry
      delete a stores folder that no kept version uses

On a cluster the stores are changed where they lie: each rank's commit is dropped by the worker
whose disk holds its store, and every worker removes a stores folder from its own disk
(:mod:`daskhps.retrain.stores`); the driver changes only the registry and the version folders.

A server holds a shared lease on the version it serves (``versions/serving/<v>.lock``, an
``flock`` the kernel drops with the process), taken before it loads the version and released
after it serves another, so a version being served is never removed, and one being removed is
never loaded. Rows that kept versions share stay: a version's commit records its state, and
compaction, which every candidate run does at its checkpoint, has already moved the live rows
out of old segments, so dropping an old commit frees what only it still used.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from daskhps.retrain.stores import Disks, drop_commit, remove_stores
from daskhps.retrain.versions import Registry, Version

__all__ = ["ServingLease", "after_publish", "prune_versions", "removable"]

log = logging.getLogger(__name__)


def _lease_path(folder: Path, version: str) -> Path:
    return folder / "serving" / f"{version}.lock"


class ServingLease:
    """A server's shared hold on the version it serves (see the module docstring)."""

    def __init__(self, registry_folder: str | Path, version: str) -> None:
        path = _lease_path(Path(registry_folder), version)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.version = version
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_SH)  # waits while retention removes it

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None


@contextlib.contextmanager
def removable(registry_folder: Path, version: str) -> Iterator[bool]:
    """Whether no server holds ``version``'s lease; while True, none can take it."""
    path = _lease_path(registry_folder, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _drop_commit(version: Version, disks: Disks) -> int:
    """Drop ``version``'s commit from every rank store of its stores folder, each where it lies;
    the number of stores it was in."""
    from daskhps.runfiles.checkpoint import load_checkpoint

    if not Path(version.checkpoint).is_dir():  # removed by hand: its commit cannot be found
        log.warning(
            "%s: its folder %s is missing; its commit stays", version.name, version.checkpoint
        )
        return 0
    return drop_commit(disks, load_checkpoint(version.checkpoint), version.name)


def after_publish(
    registry: Registry, keep_versions: int | None, disks: Disks | None = None
) -> list[str]:
    """The retention step of a retraining run that published (``retrain.keep_versions``;
    None keeps every version); ``disks``: where the stores lie (None: this machine)."""
    return [] if keep_versions is None else prune_versions(registry, keep_versions, disks)


def prune_versions(registry: Registry, keep: int, disks: Disks | None = None) -> list[str]:
    """Remove every published version but the newest ``keep``, ``CURRENT`` and those being
    served (see the module docstring); returns the names removed, oldest first. The stores
    are changed where they lie: on the workers of ``disks``, each on its own disk (None: this
    machine)."""
    disks = disks or Disks()
    current = registry.current()
    gone = registry.removed_names()
    live = [v for v in registry.versions() if v.name not in gone]
    kept = {v.name for v in live[-keep:]} | ({current.name} if current else set())
    removed: list[str] = []
    for v in live:
        if v.name in kept:
            continue
        with removable(registry.folder, v.name) as free:
            if not free:
                log.info("keeping %s: it is being served", v.name)
                kept.add(v.name)
                continue
            stores = _drop_commit(v, disks)
            shutil.rmtree(v.checkpoint, ignore_errors=True)
            registry.mark_removed(v.name)
            removed.append(v.name)
            log.info("removed %s (its commit in %d stores, its folder)", v.name, stores)
        _lease_path(registry.folder, v.name).unlink(missing_ok=True)
    used = {Path(v.stores_dir).resolve() for v in live if v.name in kept}
    for v in live:
        folder = Path(v.stores_dir).resolve()
        # on a cluster's workers, each removes what its own disk holds of them
        if v.name in removed and folder not in used and (disks.client or folder.is_dir()):
            log.info("removing stores %s: no kept version uses them", folder)
            remove_stores(disks, folder)
            used.add(folder)  # once
    return removed

"""What one worker's disk holds of a run's rank stores, found on that worker.

::

    driver: survey_workers(client, addresses, Survey(...))
      ─► every worker, pinned: survey_disk(survey)          (reads its own disk only)
           store_dir writable?  ─► each <store_dir>/<table>/rank-<r> there (every table's):
             sound at the commit asked for (and the commit the checkpoint recorded)?
             its writer lock free (waiting up to lock_wait_s for a killed run's workers)?
      ◄─ DiskReport per worker: a few lines and numbers, never a row

On several machines the driver sees none of the workers' disks, so nothing on the driver opens
a rank store: the questions a resume, a restart or a new run asks of the stores (which ranks
are here and sound, is anything still locked, can the folder be written, does it hold another
run's stores) are answered by :func:`survey_disk` on the worker that holds them.
:mod:`daskhps.training.placement` turns the answers into the ranks' places.
"""

from __future__ import annotations

import re
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daskhps._paths import check_writable_dir, free_bytes
from daskhps.distributed._pinned import run_pinned
from daskhps.errors import UnwritablePathError, first_line
from daskhps.tiers.lock import WriterLock
from daskhps.tiers.store.check import CommitId, StoreChecker

__all__ = ["DiskReport", "HeldStore", "Survey", "remove_folder", "survey_disk", "survey_workers"]

_RANK = re.compile(r"rank-(\d+)$")


@dataclass(frozen=True)
class Survey:
    """What to look for: the stores of ``table`` under ``stores_dir``, at ``commit`` (None: a
    new run, which needs the folder empty), each rank's recorded commit identity where known
    (``recorded[r]``), waiting up to ``lock_wait_s`` for a lock to be let go."""

    stores_dir: str
    table: str
    commit: str | None = None
    recorded: tuple[CommitId | None, ...] = ()
    lock_wait_s: float = 0.0
    # several tables: each further table and its ranks' recorded commits; a rank is held
    # soundly only where every table's store of it is
    others: tuple[tuple[str, tuple[CommitId | None, ...]], ...] = ()

    def recorded_id(self, rank: int) -> CommitId | None:
        return self.recorded[rank] if rank < len(self.recorded) else None

    def tables(self) -> list[Survey]:
        """One survey per table (the first is this one, less ``others``)."""
        first = Survey(self.stores_dir, self.table, self.commit, self.recorded, self.lock_wait_s)
        return [first] + [
            Survey(self.stores_dir, t, self.commit, rec, self.lock_wait_s) for t, rec in self.others
        ]


@dataclass(frozen=True)
class HeldStore:
    """One rank store on a worker's disk: ``damage`` (first problem at the commit asked for,
    or that it is another run's) is None when it is sound; ``locked`` names a writer that
    still held it after the wait."""

    rank: int
    path: str
    damage: str | None = None
    locked: str | None = None
    found: str | None = None  # the identity of the commit found (CommitId), if any

    @property
    def sound(self) -> bool:
        return self.damage is None and self.locked is None


@dataclass(frozen=True)
class DiskReport:
    """One worker's answer: where it runs, whether its ``stores_dir`` can be written, and the
    rank stores there."""

    address: str
    host: str
    unwritable: str | None = None
    stores: tuple[HeldStore, ...] = field(default_factory=tuple)
    free_bytes: int | None = None  # free on the disk that holds (or will hold) the stores

    def sound_ranks(self) -> set[int]:
        return {s.rank for s in self.stores if s.sound}

    def where(self) -> str:
        return f"worker {self.address} on host {self.host}"


def survey_disk(survey: Survey) -> DiskReport:
    """On a worker (or, for the embedded cluster, the driver's machine its workers share): what
    this machine's disk holds of ``survey``'s stores. Writes nothing: the write probe leaves no
    trace and the lock probe takes a shared lock."""
    from distributed import get_worker

    try:
        address = str(get_worker().address)
    except ValueError:  # not in a worker: the driver's own machine
        address = "local"
    host = socket.gethostname()
    try:
        check_writable_dir(survey.stores_dir, "the table's stores", "")
    except UnwritablePathError as e:
        return DiskReport(address, host, unwritable=first_line(e).rstrip("; "))
    deadline = time.monotonic() + survey.lock_wait_s
    each = [_held(one, deadline) for one in survey.tables()]
    held = each[0] if len(each) == 1 else _every_table(survey, each)
    _, free = free_bytes(survey.stores_dir)
    return DiskReport(address, host, stores=tuple(held), free_bytes=free)


def _held(survey: Survey, deadline: float) -> list[HeldStore]:
    """The rank stores of ``survey.table`` on this disk, each checked."""
    folder = Path(survey.stores_dir) / survey.table
    ranks = sorted(
        (int(m.group(1)), p)
        for p in (folder.iterdir() if folder.is_dir() else [])
        if (m := _RANK.match(p.name)) is not None and p.is_dir()
    )
    checker = StoreChecker()
    held = []
    for rank, path in ranks:
        damage = found = None
        if survey.commit is not None:
            check = checker.check(path, survey.commit, survey.recorded_id(rank))
            damage = check.damage[0] if check.damage else None
            found = None if check.found is None else str(check.found)
        held.append(HeldStore(rank, str(path), damage, _lock_holder(path, deadline), found))
    return held


def _every_table(survey: Survey, each: list[list[HeldStore]]) -> list[HeldStore]:
    """Per rank with a store of any table here, one :class:`HeldStore` for all the tables:
    sound only when every table's store of it is here and sound (a rank is trained from all
    of them), else the first table's problem, named; the first table's commit identity."""
    names = [s.table for s in survey.tables()]
    by_table = [{h.rank: h for h in held} for held in each]
    out = []
    for rank in sorted({r for found in by_table for r in found}):
        damage = locked = None
        for name, found in zip(names, by_table, strict=True):
            h = found.get(rank)
            if h is None:
                missing = Path(survey.stores_dir) / name / f"rank-{rank}"
                damage = damage or f"table {name}: no store at {missing}"
                continue
            if h.damage is not None:
                damage = damage or f"table {name}: {h.damage}"
            locked = locked or h.locked
        first = next(found[rank] for found in by_table if rank in found)
        out.append(HeldStore(rank, first.path, damage, locked, by_table[0].get(rank, first).found))
    return out


def _lock_holder(path: Path, deadline: float) -> str | None:
    """Who holds the store's writer lock once ``deadline`` passed (None: nobody)."""
    held = WriterLock(path, f"store {path.name}").wait_free(deadline)
    return None if held is None else first_line(held)


def survey_workers(
    client: Any,
    addresses: Sequence[str],
    survey: Survey,
    look: Callable[[Survey], Any] = survey_disk,
) -> list[Any]:
    """``look(survey)`` (:func:`survey_disk`, or a caller's function around it) on every
    worker of ``addresses`` at once (pinned); answers in the order of ``addresses``."""
    return run_pinned(client, list(addresses), look, survey, what="survey stores")


def remove_folder(path: str) -> None:
    """On a worker (``client.run``): remove ``path`` from its own disk, if it is there."""
    shutil.rmtree(path, ignore_errors=True)

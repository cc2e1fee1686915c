"""Ranks follow their stores: which worker trains which rank, decided from what each worker's
disk holds.

::

    new run:  every worker's store_dir writable and free of stores ─► ranks in address order
    resume, restart, warm start (same worker count):
      survey every worker (daskhps.distributed.disks) ─► rank r goes to a worker whose disk
      holds a sound store of rank r at the checkpoint's commit (address order where that
      works: an embedded cluster's workers share one disk and keep today's ranks)
      ─► a rank whose store is on no worker's disk (lost with its host) goes to a worker left
         over, which restores it from checkpoint.replicate_to onto its own disk
      ─► no copy: one line naming the lost ranks and the checkpoint they were in

Nothing here opens a store on the driver: the survey and the restore are pinned tasks on the
workers that hold (or will hold) the stores.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dask.utils import format_bytes

from daskhps._paths import tree_bytes
from daskhps.distributed import run_pinned
from daskhps.distributed.disks import DiskReport, Survey, survey_disk, survey_workers
from daskhps.distributed.reshard import reshard_on_workers
from daskhps.errors import (
    CapacityError,
    CheckpointError,
    ConfigError,
    ResumeError,
    RunExistsError,
)
from daskhps.runfiles.checkpoint import Checkpoint
from daskhps.runfiles.replica import KEY, Replica

__all__ = [
    "LOCK_WAIT_S",
    "RESUME_ADVICE",
    "Placement",
    "match_ranks",
    "place_new_run",
    "place_ranks",
    "place_resharded",
    "survey_of",
]

log = logging.getLogger(__name__)

# How long a worker waits for a store's lock to be let go: the workers of a killed driver
# release its stores once the scheduler says the driver left (daskhps.distributed.lease),
# after a running pass stops at its next batch.
LOCK_WAIT_S = 60.0

# What a run does about a store that is on no worker's disk, and that no copy restores.
RESUME_ADVICE = (
    "bring back the hosts that held them, or continue from an earlier checkpoint with --resume "
    "--checkpoint NAME --overwrite"
)


@dataclass(frozen=True)
class Placement:
    """The workers in rank order, and the ranks each new worker restored from the copy."""

    addresses: tuple[str, ...]
    restored: tuple[int, ...] = ()


def match_ranks(holders: Sequence[set[int]], num_ranks: int) -> list[int | None]:
    """Worker of each rank: ``holders[w]`` are the ranks worker ``w`` holds a sound store of.
    As many ranks as possible go to a holder (a maximum matching: augmenting paths), rank
    ``r`` to worker ``r`` wherever that works; None for a rank no free holder has."""
    owner: list[int | None] = [None] * num_ranks  # rank -> worker
    taken: dict[int, int] = {}  # worker -> rank
    for r in range(min(num_ranks, len(holders))):
        if r in holders[r]:
            owner[r], taken[r] = r, r

    def augment(r: int, seen: set[int]) -> bool:
        for w, held in enumerate(holders):
            if r in held and w not in seen:
                seen.add(w)
                if w not in taken or augment(taken[w], seen):
                    owner[r], taken[w] = w, r
                    return True
        return False

    for r in range(num_ranks):
        if owner[r] is None:
            augment(r, set())
    return owner


def place_new_run(
    client: Any,
    addresses: Sequence[str],
    store_dir: str | Path,
    tables: Sequence[str],
    replica: Replica | None,
    source: str,
    store_bytes: int | None = None,
) -> Placement:
    """A new run's ranks (address order), once every worker showed that it can write
    ``store_dir`` and the copy, has room for its share of ``store_bytes`` (the estimate of all
    the stores) and holds no stores there; one line naming the worker and the key otherwise
    (nothing is written on any disk)."""
    others = tuple((t, ()) for t in tables[1:])
    survey = Survey(str(store_dir), tables[0], others=others)  # no table's stores may be there
    reports = _survey(client, addresses, survey, replica, source)
    share = None if store_bytes is None else -(-store_bytes // len(addresses))
    for rep in reports:
        if share is not None and rep.free_bytes is not None and share > rep.free_bytes:
            raise CapacityError(
                f"{source}: table.tiers.store_dir: on {rep.where()}: its share of the stores "
                f"needs about {share / 2**30:.2f} GiB and its disk has "
                f"{rep.free_bytes / 2**30:.2f} GiB free; free disk there, add workers, or keep "
                "fewer checkpoints"
            )
    for rep in reports:
        if rep.stores:
            raise RunExistsError(
                f"{source}: table.tiers.store_dir: {rep.where()} already holds table stores at "
                f"{Path(rep.stores[0].path).parent} (another run's, or an earlier run of this "
                "folder; --overwrite sets aside only what the driver's machine holds); set "
                "table.tiers.store_dir to a new folder, or remove them on that host"
            )
    return Placement(tuple(addresses))


def place_ranks(
    client: Any,
    addresses: Sequence[str],
    ckpt: Checkpoint,
    replica: Replica | None,
    source: str,
    lock_wait_s: float = LOCK_WAIT_S,
    *,
    doing: str = "continue from",
    advice: str = RESUME_ADVICE,
) -> Placement:
    """The workers of ``addresses`` (as many as ``ckpt`` has ranks) in rank order for a run
    continuing from ``ckpt``; ranks whose store is on no worker's disk restored from
    ``replica`` by the worker that takes them (see the module docstring). A refusal says
    ``cannot {doing} {ckpt.name}`` and, for lost stores, ends with ``advice``: what to do
    (another caller than a run, a retraining job's publishing, words its own)."""
    reports = _holdings(client, addresses, ckpt, replica, source, lock_wait_s, doing)
    owner = match_ranks([rep.sound_ranks() for rep in reports], ckpt.num_workers)
    free = [w for w in range(len(reports)) if w not in set(owner)]
    lost = [r for r, w in enumerate(owner) if w is None]
    if lost:
        copied = replica is not None and replica.has_checkpoint(ckpt.name)
        if replica is None or not copied or len(free) < len(lost):
            why = None if not copied else _no_free_worker(replica, ckpt, len(lost), len(reports))
            raise ResumeError(_lost_line(ckpt, lost, reports, replica, doing, advice, why))
        for r in lost:
            owner[r] = free.pop(0)
        _restore_on_workers(client, ckpt, replica, {r: reports[owner[r]].address for r in lost})  # type: ignore[index]
    order = tuple(reports[w].address for w in owner)  # type: ignore[index]
    if list(order) != list(addresses)[: len(order)]:
        log.info(
            "ranks follow their stores: %s", ", ".join(f"{r}: {a}" for r, a in enumerate(order))
        )
    return Placement(order, tuple(lost))


def place_resharded(
    client: Any,
    addresses: Sequence[str],
    ckpt: Checkpoint,
    replica: Replica | None,
    out_dir: Path,
    source: str,
    lock_wait_s: float = LOCK_WAIT_S,
) -> Placement:
    """``ckpt``'s rows re-sharded onto the workers ``addresses`` (address order: new rank
    ``j`` writes ``<out_dir>/<table>/rank-<j>`` on the disk of ``addresses[j]``), on the
    workers (:func:`daskhps.distributed.reshard.reshard_on_workers`): each old rank store is
    read where it lies, spread over the workers that hold one, and a store on no worker's
    disk is first restored from ``replica`` by the worker with the fewest."""
    reports = _holdings(client, addresses, ckpt, replica, source, lock_wait_s, "continue from")
    load = [0] * len(reports)
    holders: dict[int, str] = {}
    lost = []
    for r in range(ckpt.num_workers):
        have = [w for w, rep in enumerate(reports) if r in rep.sound_ranks()]
        if not have:
            lost.append(r)
            continue
        w = min(have, key=lambda w: (load[w], w))  # spread the reading over the holders
        load[w] += 1
        holders[r] = reports[w].address
    if lost:
        if replica is None or not replica.has_checkpoint(ckpt.name):
            raise ResumeError(_lost_line(ckpt, lost, reports, replica))
        where = {}
        for r in lost:
            w = min(range(len(reports)), key=lambda w: (load[w], w))
            load[w] += 1
            where[r] = holders[r] = reports[w].address
        _restore_on_workers(client, ckpt, replica, where)
    report = reshard_on_workers(client, ckpt, holders, list(addresses), out_dir)
    log.info(
        "re-sharded %s on the workers: %d rows in %.1f s, %d bytes between workers (%d at least)",
        *(ckpt.name, report.rows, report.seconds, report.bytes_moved, report.min_bytes),
    )
    return Placement(tuple(addresses), tuple(lost))


def survey_of(ckpt: Checkpoint, lock_wait_s: float = 0.0) -> Survey:
    """What to ask of the workers' disks about ``ckpt``'s stores (every table's): at its
    commit, with the commit identities it recorded, waiting up to ``lock_wait_s`` for a lock."""
    first, *rest = ckpt.table_names  # a worker holds a rank when it holds every table's store
    return Survey(
        str(ckpt.stores_dir),
        first,
        ckpt.commit,
        tuple(ckpt.recorded_commits(first)),
        lock_wait_s,
        tuple((t, tuple(ckpt.recorded_commits(t))) for t in rest),
    )


def _holdings(
    client: Any,
    addresses: Sequence[str],
    ckpt: Checkpoint,
    replica: Replica | None,
    source: str,
    lock_wait_s: float,
    doing: str,
) -> list[DiskReport]:
    """What every worker's disk holds of ``ckpt``'s stores, once none is still locked and no
    two workers hold rival stores of one rank (each refused in one line)."""
    reports = _survey(client, addresses, survey_of(ckpt, lock_wait_s), replica, source)
    _refuse_locked(reports, ckpt, lock_wait_s, doing)
    _refuse_rival_claims(reports, ckpt, doing)
    return reports


def _refuse_locked(
    reports: Sequence[DiskReport], ckpt: Checkpoint, lock_wait_s: float, doing: str
) -> None:
    for rep in reports:
        for s in rep.stores:
            if s.locked is not None and s.damage is None:
                raise ResumeError(
                    f"cannot {doing} {ckpt.name}: on {rep.where()}, {s.locked} (still "
                    f"held after {lock_wait_s:g} s; is the run still going?)"
                )


def _look(survey: Survey, copy_url: str | None) -> tuple[DiskReport, str | None]:
    """On a worker: its disk's answer, and why it cannot write the copy (None: it can)."""
    problem = None if copy_url is None else Replica(copy_url).unwritable()
    return survey_disk(survey), problem


def _survey(
    client: Any,
    addresses: Sequence[str],
    survey: Survey,
    replica: Replica | None,
    source: str,
) -> list[DiskReport]:
    """Every worker's answer; one line for the first worker that cannot write the stores or
    the copy."""
    url = replica.url if replica is not None else None
    answers = survey_workers(client, addresses, survey, functools.partial(_look, copy_url=url))
    for rep, copy_problem in answers:
        if rep.unwritable is not None:
            raise ConfigError(
                f"{source}: table.tiers.store_dir: on {rep.where()}: {rep.unwritable}; set it "
                "to a folder every worker can write on its own disk"
            )
        if copy_problem is not None:
            raise ConfigError(
                f"{source}: {KEY}: on {rep.where()}: {copy_problem} (every worker writes its "
                "stores' copy there)"
            )
    return [rep for rep, _ in answers]


def _refuse_rival_claims(
    reports: Sequence[DiskReport], ckpt: Checkpoint, doing: str = "continue from"
) -> None:
    """Two workers holding different stores of one rank at the checkpoint's commit, where the
    checkpoint recorded no commit identity to tell the right one: refused, naming both."""
    recorded = ckpt.recorded_commits()
    claims: dict[int, tuple[DiskReport, str]] = {}
    for rep in reports:
        for s in rep.stores:
            known = s.rank >= len(recorded) or recorded[s.rank] is not None
            if not s.sound or s.found is None or known:
                continue
            other = claims.setdefault(s.rank, (rep, s.found))
            if other[1] != s.found:
                raise ResumeError(
                    f"cannot {doing} {ckpt.name}: {other[0].where()} and {rep.where()} "
                    f"both hold a store of rank {s.rank} at {s.path}, with different commits "
                    f"{ckpt.commit!r} ({other[1]}; {s.found}); remove the one that is not this "
                    "run's"
                )


def _no_free_worker(replica: Replica | None, ckpt: Checkpoint, lost: int, workers: int) -> str:
    """Why lost stores that the copy holds are not restored: too few workers."""
    assert replica is not None
    return (
        f"and only {workers} worker{'s' if workers != 1 else ''} for its {ckpt.num_workers} "
        f"ranks: none is free to restore {'them' if lost > 1 else 'it'} onto from the copy at "
        f"{replica.url}"
    )


def _lost_line(
    ckpt: Checkpoint,
    lost: list[int],
    reports: Sequence[DiskReport],
    replica: Replica | None,
    doing: str = "continue from",
    advice: str = RESUME_ADVICE,
    why: str | None = None,
) -> str:
    damaged = [
        f"{rep.where()}: {s.damage}" for rep in reports for s in rep.stores if s.rank in lost
    ]
    ranks = ", ".join(str(r) for r in lost)
    if why is None:
        why = (
            "and checkpoint.replicate_to is not set"
            if replica is None
            else f"and the copy at {replica.url} does not hold {ckpt.name}"
        )
    seen = f" (found instead: {damaged[0]})" if damaged else ""
    return (
        f"cannot {doing} {ckpt.name} of {ckpt.path.parent.parent}: the store of rank"
        f"{'s' if len(lost) > 1 else ''} {ranks} is on none of the {len(reports)} workers' "
        f"disks{seen}, {why}; {advice}"
    )


def _restore_rank(rank: int, ckpt: Checkpoint, url: str) -> tuple[int, float]:
    """On the worker that takes ``rank``: download its store of ``ckpt`` from the copy onto
    this worker's disk (a damaged or foreign store there is moved aside, never deleted); the
    bytes its stores hold then, and the seconds it took."""
    t0 = time.monotonic()
    Replica(url).restore_store(ckpt, rank)
    seconds = time.monotonic() - t0
    return sum(tree_bytes(ckpt.store_path(rank, t)) for t in ckpt.table_names), seconds


def _restore_on_workers(
    client: Any, ckpt: Checkpoint, replica: Replica, where: dict[int, str]
) -> None:
    ranks = sorted(where)
    try:
        done = run_pinned(
            client,
            [where[r] for r in ranks],
            _restore_rank,
            ckpt,
            replica.url,
            rank_args=[(r,) for r in ranks],
            what="restore stores from the copy",
        )
    except (CheckpointError, OSError) as e:
        raise ResumeError(f"cannot continue from {ckpt.name}: {e}") from None
    for r, (size, seconds) in zip(ranks, done, strict=True):
        # The size and the time say whether a restore is bound by the copy's reads: at this
        # size, a lost host's time to training again is mostly this.
        log.warning(
            "restored rank %d's store of %s from %s onto %s (it was on no worker's disk): "
            "%s in %.2f s (%s/s)",
            *(r, ckpt.name, replica.url, where[r], format_bytes(size), seconds),
            format_bytes(int(size / max(seconds, 1e-3))),
        )

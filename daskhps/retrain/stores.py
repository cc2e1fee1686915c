"""A retraining run's steps on the rank stores, each run where the store lies.

::

    Disks(client)   the cluster's workers, each with its own disk: a survey
                    (daskhps.distributed.disks) finds the worker holding each rank's store,
                    and the step runs there as a pinned task
    Disks(None)     this machine: no cluster is up (a rollback of a run on the embedded
                    cluster, whose workers share this machine's disk)

    publish    commit_version   the candidate's stores placed as a run's are
                                (daskhps.training.placement: a store on no worker's disk is
                                restored from the candidate's copy onto a free worker), then
                                each holder commits the version's name ─► CommitInfo per rank
    retention  drop_commit      each holder of an old version's commit drops it
               remove_stores    every worker removes the folder from its own disk
    rollback   missing_commit   the ranks whose store holds the version's commit on no disk

A task answers with a few numbers (a CommitInfo, a flag), never a row. On several machines the
driver sees none of the stores, so no step opens one there; on the embedded cluster the same
tasks run on its workers, which share the driver's disk.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daskhps.distributed import run_pinned
from daskhps.distributed.disks import (
    DiskReport,
    Survey,
    remove_folder,
    survey_disk,
    survey_workers,
)
from daskhps.passes.owners import worker_addresses
from daskhps.runfiles.checkpoint import Checkpoint
from daskhps.runfiles.replica import Replica
from daskhps.table import open_shard_store
from daskhps.tiers.base import CommitInfo
from daskhps.tiers.store.writer import StoreWriter
from daskhps.training.placement import match_ranks, place_ranks, survey_of

__all__ = ["Disks", "commit_version", "drop_commit", "missing_commit", "remove_stores"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Disks:
    """Where the steps run: on the workers of ``client`` (each on its own disk), or on this
    machine (``client`` None). ``source`` names the config in a refusal."""

    client: Any | None = None
    source: str = ""

    def workers(self) -> list[str]:
        """The workers in the cluster now (one lost since the run trained is not asked)."""
        return worker_addresses(self.client)

    def survey(self, survey: Survey) -> list[DiskReport]:
        """Every disk's answer: each worker's, or this machine's."""
        if self.client is None:
            return [survey_disk(survey)]
        return survey_workers(self.client, self.workers(), survey)

    def run(
        self,
        where: Sequence[str],
        fn: Callable[..., Any],
        *args: Any,
        rank_args: Sequence[Sequence[Any]],
        what: str,
    ) -> list[Any]:
        """``fn(*rank_args[i], *args)`` on worker ``where[i]`` (pinned), or here, in order."""
        if self.client is None:
            return [fn(*a, *args) for a in rank_args]
        return run_pinned(self.client, list(where), fn, *args, rank_args=rank_args, what=what)


def _ranks_of(ckpt: Checkpoint) -> list[tuple[int]]:
    return [(r,) for r in range(ckpt.num_workers)]


# -- publish ------------------------------------------------------------------------------


def _commit_rank(
    rank: int, ckpt: Checkpoint, name: str, meta: dict[str, Any]
) -> dict[str, CommitInfo]:
    """On the holder of rank ``rank``'s stores: commit each table's, opened at ``ckpt``'s
    commit, again as ``name``; each table's new commit, by table name."""
    out = {}
    for table in ckpt.table_names:
        with ckpt.open_store(rank, mode="r+", table=table) as store:
            out[table] = store.commit(name, meta)
    return out


def commit_version(
    disks: Disks, ckpt: Checkpoint, name: str, meta: dict[str, Any], version: str
) -> list[dict[str, CommitInfo]]:
    """Commit every rank store of ``ckpt`` (the candidate; every table's) as ``name``, each on
    the worker that holds it; what identifies each rank's new commits (by table), in rank
    order. A store on no
    worker's disk comes back from the candidate's copy (``checkpoint.replicate_to``) onto a
    worker that holds none; without one, one line naming the rank and the version, and
    nothing is published."""
    if disks.client is None:
        return [_commit_rank(r, ckpt, name, meta) for r in range(ckpt.num_workers)]
    placed = place_ranks(
        disks.client,
        disks.workers(),
        ckpt,
        Replica.of(ckpt.config),
        disks.source,
        doing=f"publish {version} from",
        advice=(
            "nothing was published and the current version stays: bring back the hosts that "
            "held them and run daskhps retrain again (it trains these days again)"
        ),
    )
    return disks.run(
        placed.addresses,
        _commit_rank,
        ckpt,
        name,
        meta,
        rank_args=_ranks_of(ckpt),
        what=f"commit {name}",
    )


# -- retention ----------------------------------------------------------------------------


def _drop_rank(rank: int, ckpt: Checkpoint, commit: str) -> bool:
    """On the holder of rank ``rank``'s stores: drop ``commit`` from every table's (opened at
    the latest state, so that the dropped commit's segments are not the live ones); whether
    it was in any."""
    dropped = False
    for spec in ckpt.table_specs:
        with open_shard_store(spec, ckpt.store_path(rank, spec.name), mode="r+") as store:
            assert isinstance(store, StoreWriter)
            dropped |= bool(store.drop_named([commit]))
    return dropped


def drop_commit(disks: Disks, ckpt: Checkpoint, version: str) -> int:
    """Drop ``ckpt``'s commit (a published version's) from every rank store that holds it,
    each on its own worker; the number of stores it was dropped from. A store on no disk keeps
    it: a warning names the rank and the version (nothing reads that commit any more)."""
    reports = disks.survey(survey_of(ckpt))
    owner = match_ranks([rep.sound_ranks() for rep in reports], ckpt.num_workers)
    for r, w in enumerate(owner):
        if w is not None:
            continue
        seen = [(rep, s) for rep in reports for s in rep.stores if s.rank == r]
        if not seen:
            log.warning(
                "%s: the store of rank %d is on none of the %d disks asked (its host is gone?); "
                "its commit %r stays in it, where nothing reads it: remove %s on that host once "
                "no kept version uses it",
                *(version, r, len(reports), ckpt.commit, ckpt.stores_dir),
            )
        elif any(s.locked for _, s in seen):
            rep, s = next((rep, s) for rep, s in seen if s.locked)
            log.warning("%s: on %s, %s; its commit stays", version, rep.where(), s.locked)
        else:  # dropped already (a retention cut short), or never committed
            log.info("%s: rank %d's store holds no sound commit %r", version, r, ckpt.commit)
    ranks = [(r,) for r, w in enumerate(owner) if w is not None]
    where = [reports[w].address for w in owner if w is not None]
    dropped = disks.run(where, _drop_rank, ckpt, ckpt.commit, rank_args=ranks, what="drop commit")
    return sum(dropped)


def remove_stores(disks: Disks, folder: Path) -> None:
    """Remove the stores folder ``folder`` from every disk that holds some of it."""
    if disks.client is None:
        remove_folder(str(folder))
    else:
        disks.client.run(remove_folder, str(folder))


# -- rollback -----------------------------------------------------------------------------


def missing_commit(disks: Disks, ckpt: Checkpoint) -> list[str]:
    """Per rank whose store holds ``ckpt``'s commit (sound) on no disk: what was found
    instead, naming the rank. Empty when every rank's is somewhere."""
    reports = disks.survey(survey_of(ckpt))
    have = {s.rank for rep in reports for s in rep.stores if s.damage is None}
    out = []
    for r in range(ckpt.num_workers):
        if r in have:
            continue
        seen = [f"{s.damage}" for rep in reports for s in rep.stores if s.rank == r]
        unwritable = [f"on {rep.where()}: {rep.unwritable}" for rep in reports if rep.unwritable]
        found = seen or unwritable or [f"no store at {ckpt.store_path(r)}"]
        on = "" if disks.client is None else f" on any of the {len(reports)} workers' disks"
        out.append(f"the store of rank {r}{on} ({found[0]})")
    return out

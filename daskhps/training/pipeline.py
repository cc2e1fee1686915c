"""The pass pipeline: every pass goes through prepare, stage ahead, activate, train, release.

::

    driver thread ("prepare")                 main thread
    -------------------------                 -----------
    prepare(k+1): read the pass's partitions, activate(k): pin k's keys if staging ahead
      owner keys (with their counts and days)   did not (rows evicted since come back)
      and examples placed on their workers    train(k) on every rank, in one call: admit
                                                k's new keys (admission), the batches
    stage ahead(k+1): pin beside k's pins,    release(k), in one call once k+1's staging
      when both fit the device tier             ahead is done: count k's keys in their
                                                rows, rows expire if k ends a log day,
                                                unpin k; then pin k+1 again (what was
                                                staged ahead is pinned once k is gone)

Pass k+1 is read, hashed, deduplicated, shuffled and staged on the driver thread while pass k
trains on the workers (Baidu's pipeline). That needs a second thread on every worker: with
one, a shuffle task of pass k+1 could hold a worker's only thread while the other ranks wait
for it inside a collective of pass k, so with one thread pass k+1 is prepared after pass k.
Nothing of the log stays on the workers between passes: each pass reads its own partitions
when it is prepared and releases them once its keys and examples are placed. The first pass
of a new plan reads none: the planning scan kept them parsed (``PassContext.kept``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

from daskhps.data.readers import ClickLog
from daskhps.distributed import (
    PassEnd,
    RunGroup,
    StageAhead,
    WorkerShards,
    end_pass,
    stop_waits_when,
)
from daskhps.monitor.network import RouteAccount
from daskhps.passes import PassPlan, PassSpec, owner_keys, place_together
from daskhps.passes.keys import pass_keys, pass_partitions
from daskhps.passes.scan import KeptReads
from daskhps.sharding import ShardMap
from daskhps.table import StageReport
from daskhps.table.stats import day_string
from daskhps.training.examples import route_examples
from daskhps.training.killpoints import kill_point

__all__ = ["PassContext", "PassPipeline", "PreparedPass", "prepare_pass"]

log = logging.getLogger(__name__)

# How long closing the pipeline waits for a pass being prepared: its waits on the workers stop
# within a poll once told to, so this is seconds; past it the (daemon) thread is left behind.
CLOSE_S = 10.0


@dataclass(frozen=True)
class PassContext:
    """What preparing any pass of a run needs."""

    group: RunGroup
    train_log: ClickLog
    plan: PassPlan
    shard_map: ShardMap
    table: str | None  # None: several tables, each key going to its own (WorkerShards.split)
    batch_size: int  # global
    # the first pass's partitions, parsed by the planning scan: its graph reuses them
    kept: KeptReads = field(default_factory=KeptReads)

    def stage(self, keys: Sequence[Any], what: str) -> list[StageReport]:
        """Pin ``keys[r]`` (futures of owner partitions) in rank ``r``'s shard."""
        return self.group.on_shards(
            WorkerShards.stage, self.table, rank_args=[(k,) for k in keys], what=what
        )


@dataclass
class PreparedPass:
    """A pass ready to train: its keys and examples on their workers, maybe already staged."""

    spec: PassSpec
    keys: tuple[Any, ...]
    examples: tuple[Any, ...]
    position: int = 0  # in the run's schedule (over all epochs)
    staged: bool = False
    reports: list[StageReport] = field(default_factory=list)
    late: list[StageReport] = field(default_factory=list)
    early: list[StageReport] = field(default_factory=list)  # tables staged ahead of a refusal
    seconds: dict[str, float] = field(default_factory=dict)

    def stage(self, ctx: PassContext) -> None:
        """Stage (or re-pin) the pass's keys; rows evicted since an early staging come back."""
        t = time.perf_counter()
        reports = ctx.stage(self.keys, "stage shards")
        kill_point("stage", self.position)
        if self.staged:
            self.late = reports
        else:
            self.reports, self.staged = reports, True
        self.seconds["stage"] = self.seconds.get("stage", 0.0) + time.perf_counter() - t

    def staged_from(self) -> dict[str, int]:
        """Where the staged rows came from (re-pinning counts only rows fetched again)."""
        out = {
            "device": sum(r.from_device for r in self.reports),
            "host": sum(r.from_host for r in self.reports),
            "store": sum(r.from_store for r in self.reports),
            "init": sum(r.initialised for r in self.reports),
        }
        for r in (*self.late, *self.early):
            out["host"] += r.from_host
            out["store"] += r.from_store
            out["init"] += r.initialised
        return {k: int(v) for k, v in out.items()}


@dataclass(frozen=True)
class Released:
    """What releasing a pass took: ``unpin_repin_s`` (the call and the re-pin, less the
    counting and the expiry), ``count_s``, ``expire_s`` and the rows and pending counts
    expired with the day that ended (``expiry``; empty where the pass ends no log day)."""

    unpin_repin_s: float
    count_s: float
    expire_s: float = 0.0
    expiry: dict[str, Any] = field(default_factory=dict)


def prepare_pass(ctx: PassContext, spec: PassSpec, position: int) -> PreparedPass:
    """Read the pass's partitions, route its keys to their owners and its examples to their
    workers, and try to stage the keys (pinned) while the previous pass may still hold its
    own pins."""
    t = time.perf_counter()
    addresses = ctx.group.addresses
    # The pass's partitions, read, parsed and hashed once for both its keys and its examples
    # (held until both are placed, then released).
    where, lengths, offset = pass_partitions(ctx.plan.partition_lengths, spec.start, spec.stop)
    rows = ctx.train_log.partitions(where)
    rows = dataclasses.replace(rows, frame=rows.frame.persist())
    start, stop = spec.start - offset, spec.stop - offset
    # the shuffles count their bytes between ranks on the workers; the pass's training
    # collects them (daskhps.monitor.network)
    account = RouteAccount(ctx.group.token, position, tuple(addresses))
    owned = owner_keys(
        pass_keys(rows, lengths, start, stop),
        ctx.shard_map,
        ctx.plan.config.shuffle_method,
        account,
    )
    routed = route_examples(
        rows.frame,
        lengths,
        start,
        stop,
        batch_size=ctx.batch_size,
        num_workers=len(addresses),
        order=spec.order() - offset if spec.shuffled else None,
        account=account,
    )
    keys, examples = place_together(ctx.group.client, [owned, routed], addresses)
    del rows, owned, routed  # their graphs hold the read partitions: released with them
    ctx.kept.release()  # what the scan kept served this pass (the first), or nothing
    prepared = PreparedPass(spec, keys.futures, examples.futures, position)
    prepared.seconds["route"] = time.perf_counter() - t
    t = time.perf_counter()
    ahead: list[StageAhead] = ctx.group.on_shards(
        WorkerShards.try_stage,
        ctx.table,
        rank_args=[(k,) for k in keys.futures],
        what="stage ahead",
    )
    refused = [a.refusal for a in ahead if not a.fitted]
    if refused:
        # Both working sets do not fit the device tier together: the pass is staged once the
        # previous one unpins.
        log.debug("pass %d staged after the previous one: %s", spec.index, refused[0])
        # the tables that did fit fetched their rows now: counted here, not when re-pinned
        prepared.early = [a.report for a in ahead if a.report is not None]
    else:
        prepared.reports = [a.report for a in ahead if a.report is not None]
        prepared.staged = True
        kill_point("stage", position)
    prepared.seconds["stage_ahead"] = time.perf_counter() - t
    return prepared


class PassPipeline:
    """The passes ``schedule[start:]`` of a run, each yielded once activated (its keys
    pinned); the caller trains it, then calls :meth:`release`.

    ``overlap``: prepare pass k+1 while pass k trains (workers with two threads); otherwise
    pass k+1 is prepared once pass k is done.
    """

    def __init__(
        self, ctx: PassContext, schedule: Sequence[PassSpec], start: int, overlap: bool
    ) -> None:
        self.ctx = ctx
        self.schedule = list(schedule)
        self.start = start
        self.overlap = overlap
        self._stop = threading.Event()  # set by close: the preparing thread's waits end
        self._preparing: Future[PreparedPass] | None = None
        self._ahead: Future[PreparedPass] | None = None

    def _prepare(self, position: int) -> Future[PreparedPass]:
        """Prepare pass ``position`` on its own thread (one at a time: each is waited for
        before the next starts). A daemon thread, unlike an executor's, which the interpreter
        joins at exit without a deadline: a thread stuck in a wait must not keep the process."""
        future: Future[PreparedPass] = Future()

        def run() -> None:
            future.set_running_or_notify_cancel()
            try:
                with stop_waits_when(self._stop):
                    future.set_result(prepare_pass(self.ctx, self.schedule[position], position))
            except BaseException as e:  # handed to whoever waits on the pass
                future.set_exception(e)

        threading.Thread(target=run, name="daskhps-prepare", daemon=True).start()
        self._preparing = future
        return future

    def __iter__(self) -> Iterator[PreparedPass]:
        n = len(self.schedule)
        upcoming = self._prepare(self.start) if self.start < n else None
        for i in range(self.start, n):
            assert upcoming is not None
            active = upcoming.result()
            if not active.staged:  # activate: staging ahead did not fit beside the last pass
                active.stage(self.ctx)
            has_next = i + 1 < n
            self._ahead = self._prepare(i + 1) if self.overlap and has_next else None
            yield active
            if has_next:
                upcoming = self._ahead or self._prepare(i + 1)

    def release(self, active: PreparedPass, day: int | None = None) -> Released:
        """End trained ``active`` on each rank in one call (:func:`~daskhps.distributed.end_pass`):
        count its keys, remove the rows the expiry rule expires when it ends log day ``day``
        (a ``last_day`` number), unpin its keys. Then the next pass, if staged ahead, is
        pinned again. That staging is waited for first: it must not race the unpin, and the
        counting would otherwise wait on it for the tables' locks."""
        t = time.perf_counter()
        upcoming = self._ahead.result() if self._ahead is not None else None
        ends: list[PassEnd] = self.ctx.group.on_shards(
            end_pass,
            self.ctx.table,
            day,
            rank_args=[(k,) for k in active.keys],
            what="end pass",
        )
        if upcoming is not None:
            upcoming.stage(self.ctx)  # re-pin what was staged ahead
        count_s = max(e.count_s for e in ends)  # the ranks wait for the slowest
        expire_s = max(e.expire_s for e in ends)
        rest = time.perf_counter() - t - count_s - expire_s
        if day is None:
            return Released(rest, count_s)
        expiry: dict[str, Any] = {
            k: sum(e.expired[k] for e in ends) for k in ("expired", "pending_expired")
        }
        expiry["day"] = day_string(day)
        return Released(rest, count_s, expire_s, expiry)

    def close(self) -> None:
        """Stop the pass being prepared, if any (Ctrl-C, a failure), and wait for it at most
        :data:`CLOSE_S`: its waits on the workers end within a poll."""
        self._stop.set()
        preparing = self._preparing
        if preparing is None or preparing.done():
            return
        if not wait([preparing], timeout=CLOSE_S).done:
            log.warning("the pass being prepared did not stop within %g s; left behind", CLOSE_S)

    def __enter__(self) -> PassPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The end of a trained pass on one rank, in one call: its keys counted, the rows that expire
removed where it ends a log day, its keys unpinned.

One call, not three: each call costs every rank a round trip to the scheduler, more than this
work on a small pass. The driver makes it through
:meth:`~daskhps.distributed.RunGroup.on_shards` (``group.on_shards(end_pass, table, day,
rank_args=...)``), like any :class:`~daskhps.distributed.WorkerShards` verb.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from daskhps.distributed.shards import WorkerShards

__all__ = ["PassEnd", "end_pass"]


@dataclass(frozen=True)
class PassEnd:
    """One rank's answer to :func:`end_pass`: the rows and pending counts expired (zeros
    where no day ended), and the seconds the counting and the expiry took."""

    expired: dict[str, int]
    count_s: float
    expire_s: float


def end_pass(shards: WorkerShards, table: str | None, today: int | None, keys: Any) -> PassEnd:
    """End a trained pass (``keys``: its owner partition) on this rank: its keys counted
    (:meth:`WorkerShards.record_seen`), the rows that expire gone when it ends log day
    ``today`` (:meth:`WorkerShards.expire`), its keys unpinned."""
    t0 = time.perf_counter()
    shards.record_seen(table, keys)
    t1 = time.perf_counter()
    expired = {"expired": 0, "pending_expired": 0}
    if today is not None:
        expired = shards.expire(table, today)
    t2 = time.perf_counter()
    shards.unpin(table)
    return PassEnd(expired, t1 - t0, t2 - t1)

"""Expiry: which rows leave the table at a day boundary.

::

    every row of a shard (the freshest copy: device, host, then store), with its statistics
       │
       ├─ ttl_days D: last_day <= today - D ──────────────────────► expired
       │              (days of the data: today is the last log day trained on;
       │               a row of unknown day, last_day 0, is kept)
       └─ max_rows R: per virtual shard, the rows beyond its share of R (ceil(R / num_shards)),
                      lowest score first ──────────────────────────► expired
                      lfu: (count, last_day, key); lru: (last_day, count, key)

    expired rows: removed from every tier (a deletion record in the store); a key staged for
    the next pass reads its initial value again, as an unseen key does

A row's virtual shard is a function of its key, so which rows ``max_rows`` keeps does not
depend on the worker count, and neither does ``ttl_days``. Pending counts of keys not admitted
yet (:mod:`daskhps.table.admission`) expire by ``ttl_days`` the same way. Everything here is
vectorised over a shard's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from daskhps.sharding import shard_of
from daskhps.table.stats import NO_DAY

__all__ = ["ExpiryRule"]


@dataclass(frozen=True)
class ExpiryRule:
    """When rows leave the table (``table.expiry``)."""

    ttl_days: int | None = None
    max_rows: int | None = None
    score: Literal["lfu", "lru"] = "lfu"
    num_shards: int = 1

    @property
    def expires(self) -> bool:
        return self.ttl_days is not None or self.max_rows is not None

    def stale(self, days: np.ndarray, today: int) -> np.ndarray:
        """Rows (or pending counts) not seen for ``ttl_days`` days by ``today``."""
        days = np.asarray(days)
        if self.ttl_days is None:
            return np.zeros(days.shape, dtype=bool)
        return (days != NO_DAY) & (days <= today - self.ttl_days)

    def expired(
        self, keys: np.ndarray, counts: np.ndarray, days: np.ndarray, today: int
    ) -> np.ndarray:
        """Which rows (unique ``keys`` with their statistics) expire at the end of ``today``
        (a ``last_day`` number)."""
        out = self.stale(days, today)
        if self.max_rows is None or len(keys) == 0:
            return out
        keep = ~out
        share = -(-self.max_rows // self.num_shards)  # ceil: every shard's share of max_rows
        shard = shard_of(np.asarray(keys, np.int64), self.num_shards)
        first, second = (counts, days) if self.score == "lfu" else (days, counts)
        # Highest score first within each shard (the key breaks ties, so the choice is exact;
        # ~x orders as -x without overflowing at the smallest int64).
        order = np.lexsort((~np.asarray(keys), ~np.asarray(second), ~np.asarray(first), shard))
        order = order[keep[order]]
        rank = np.arange(len(order)) - np.searchsorted(shard[order], shard[order], side="left")
        out[order[rank >= share]] = True
        return out

"""Admission: a key gets a row of the table only once it has occurred often enough.

::

    pass k's keys at their owner ──► rows of the table (admitted before) ──► train as ever
      (unique, with counts)     └──► the rest: prior = pending count ──► prior + seen >= min_count
                                                                         (and the draw, below)?
                                          yes: admitted in pass k ──► a row; it trains in pass k,
                                                                      its count starts at
                                                                      prior + seen
                                          no:  stays pending ──► reads init(seed, key), gets no
                                                                 update; pending += seen

A key is admitted in the pass in which its count reaches ``min_count``. With a
``probability`` p below 1, each of its occurrences from the ``min_count``-th on admits it with
probability p: a pass that holds ``k`` such occurrences admits it with probability
``1 - (1 - p)**k``, decided by a hash of (table seed, key, its count before the pass), so the
decision is the same on every worker count, in every rerun and on every resume.

:class:`PendingCounts` holds, per shard, the counts and last days of the keys that occurred
and are not admitted yet: 16 bytes a key (an int64 key, an int32 count, an int32 day), sorted
by key, on the host. They are committed with the shard's store, as its attached arrays
``pending_keys`` and ``pending_stats``, so a checkpoint, a published version and a re-shard
(which routes each count to its key's new owner, like a row) carry them; they change only when
a pass is counted, after it trained, so a pass prepared ahead leaks nothing into the
checkpoint before it. Everything here is vectorised over a pass's keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from daskhps._mix64 import fmix64_numpy
from daskhps.table.stats import COUNT_MAX

__all__ = ["ADMISSION_SALT", "AdmissionRule", "PendingCounts", "find_sorted"]

ADMISSION_SALT = 0x41444D4954544544  # "ADMITTED": decorrelates the draw from other hashes
_GOLDEN = 0x9E3779B97F4A7C15  # spreads the prior count over all 64 bits before mixing


@dataclass(frozen=True)
class AdmissionRule:
    """When a key not in the table gets a row (``table.admission``)."""

    min_count: int = 1
    probability: float = 1.0
    seed: int = 0

    @property
    def admits_all(self) -> bool:
        """Every key gets a row in the first pass that holds it (no admission)."""
        return self.min_count <= 1 and self.probability >= 1.0

    def admitted(self, keys: np.ndarray, prior: np.ndarray, seen: np.ndarray) -> np.ndarray:
        """Which of ``keys`` (not in the table; ``prior`` occurrences counted before this
        pass, ``seen`` in it) this pass admits."""
        prior = np.asarray(prior, dtype=np.int64)
        total = prior + np.asarray(seen, dtype=np.int64)
        reached = total >= self.min_count
        if self.probability >= 1.0:
            return reached
        eligible = np.maximum(total - np.maximum(prior, self.min_count - 1), 0)
        chance = -np.expm1(eligible * np.log1p(-self.probability))  # 1 - (1 - p)**eligible
        return reached & (self.draw(keys, prior) < chance)

    def draw(self, keys: np.ndarray, prior: np.ndarray) -> np.ndarray:
        """A uniform number in [0, 1) per key, a pure function of (seed, key, prior)."""
        with np.errstate(over="ignore"):
            salt = np.uint64(ADMISSION_SALT ^ (self.seed * _GOLDEN % (1 << 64)))
            z = np.asarray(keys, dtype=np.int64).view(np.uint64) ^ salt
            z ^= np.asarray(prior, dtype=np.int64).view(np.uint64) * np.uint64(_GOLDEN)
            z = fmix64_numpy(z)
        return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _pairs(stats: np.ndarray) -> np.ndarray:
    """An ``int32[n, 2]`` as ``int64[n]``, no copy: numpy moves one 8-byte item per row
    several times faster than a row of two."""
    return np.ascontiguousarray(stats).view(np.int64).reshape(-1)


def find_sorted(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``keys`` is (or would go) in the sorted unique ``sorted_keys``, and
    whether it is there: one binary search each (``np.isin`` sorts both, ten times slower)."""
    at = np.searchsorted(sorted_keys, keys)
    found = at < len(sorted_keys)
    found[found] = sorted_keys[at[found]] == keys[found]
    return at, found


class PendingCounts:
    """The not-yet-admitted keys of one shard: sorted unique keys, each with its count and
    last day (``stats[:, 0]``, ``stats[:, 1]``; a day as in :mod:`daskhps.table.stats`)."""

    KEYS = "pending_keys"
    STATS = "pending_stats"
    BYTES_PER_KEY = 16

    def __init__(self, keys: np.ndarray | None = None, stats: np.ndarray | None = None) -> None:
        self.keys = np.empty(0, np.int64) if keys is None else np.asarray(keys, np.int64)
        self.stats = np.empty((0, 2), np.int32) if stats is None else np.asarray(stats, np.int32)
        if self.stats.shape != (len(self.keys), 2) or (
            len(self.keys) > 1 and not bool((self.keys[1:] > self.keys[:-1]).all())
        ):
            raise ValueError(
                f"pending counts need sorted unique keys and one (count, day) per key, got "
                f"{self.keys.shape} keys and stats {self.stats.shape}"
            )

    # -- the store's attached arrays ------------------------------------------------------

    @classmethod
    def from_arrays(cls, keys: np.ndarray | None, stats: np.ndarray | None) -> PendingCounts:
        """From a store's attached arrays (both None: a commit that carries none)."""
        if keys is None and stats is None:
            return cls()
        return cls(keys, stats)

    @classmethod
    def merged(cls, parts: list[PendingCounts]) -> PendingCounts:
        """The pending counts of shards that hold disjoint keys, as one."""
        keys = np.concatenate([np.empty(0, np.int64), *(p.keys for p in parts)])
        stats = np.concatenate([np.empty((0, 2), np.int32), *(p.stats for p in parts)])
        order = np.argsort(keys, kind="stable")
        return cls(keys[order], stats[order])

    def arrays(self) -> dict[str, np.ndarray]:
        """What a commit attaches."""
        return {self.KEYS: self.keys, self.STATS: self.stats}

    # -- reading and changing them ----------------------------------------------------------

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.stats.nbytes)

    def _find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of ``keys`` among the pending ones and whether each is there."""
        return find_sorted(self.keys, keys)

    def counts(self, keys: np.ndarray) -> np.ndarray:
        """The pending count of each of ``keys`` (0 where none), int64."""
        keys = np.asarray(keys, np.int64)
        at, found = self._find(keys)
        out = np.zeros(len(keys), np.int64)
        out[found] = self.stats[at[found], 0]
        return out

    def add(self, keys: np.ndarray, counts: np.ndarray, days: np.ndarray | int) -> None:
        """Count ``counts`` more occurrences of unique ``keys``, last seen on ``days`` (one per
        key or one for all; the later day wins; counts saturate at 2**31 - 1)."""
        keys = np.asarray(keys, np.int64)
        counts = np.asarray(counts, np.int64)
        days = np.broadcast_to(np.asarray(days, np.int32), keys.shape)
        at, found = self._find(keys)
        hit = at[found]
        self.stats[hit, 0] = np.minimum(self.stats[hit, 0] + counts[found], COUNT_MAX)
        self.stats[hit, 1] = np.maximum(self.stats[hit, 1], days[found])
        new = ~found
        if not bool(new.any()):
            return
        order = np.argsort(keys[new], kind="stable")
        nkeys = keys[new][order]
        nstats = np.stack(
            [np.minimum(counts[new][order], COUNT_MAX), days[new][order]], axis=1
        ).astype(np.int32)
        # One merge of two sorted arrays: each new key lands before the old keys above it.
        n, m = len(self.keys), len(nkeys)
        at_new = np.searchsorted(self.keys, nkeys) + np.arange(m)
        is_new = np.zeros(n + m, dtype=bool)
        is_new[at_new] = True
        merged_keys = np.empty(n + m, np.int64)
        merged_stats = np.empty(n + m, np.int64)  # (count, day) pairs as one int64 each
        merged_keys[at_new], merged_stats[at_new] = nkeys, _pairs(nstats)
        merged_keys[~is_new], merged_stats[~is_new] = self.keys, _pairs(self.stats)
        self.keys, self.stats = merged_keys, merged_stats.view(np.int32).reshape(-1, 2)

    def pop(self, keys: np.ndarray) -> np.ndarray:
        """Remove ``keys`` (those pending; the rest are ignored); returns each one's count
        (0 where none), int64."""
        keys = np.asarray(keys, np.int64)
        at, found = self._find(keys)
        out = np.zeros(len(keys), np.int64)
        out[found] = self.stats[at[found], 0]
        if bool(found.any()):
            keep = np.ones(len(self.keys), dtype=bool)
            keep[at[found]] = False
            self.keys = self.keys[keep]
            self.stats = _pairs(self.stats)[keep].view(np.int32).reshape(-1, 2)
        return out

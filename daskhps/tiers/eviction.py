"""Which rows a slot cache displaces: the least recently (LRU) or least frequently (LFU) used.

::

    stamp  int64[capacity + 1]   clock of the last use (LRU; LFU tie-break); the last entry
                                 is a sink for the misses of a lookup
    count  int64[capacity + 1]   uses since insertion (LFU only)

Victims are chosen over the whole cache among its unpinned resident rows: by a histogram of
the stamps while they span a small range, else by one top-k. An LRU scan also keeps the next
oldest sixteenth of the slots as a pool that serves later evictions without a scan (exact:
stamps only grow).
"""

from __future__ import annotations

import torch

from daskhps.errors import CapacityError
from daskhps.tiers.reserve import reserve_zeros

__all__ = ["POLICIES", "EvictionPolicy"]

POLICIES = ("lru", "lfu")
_NEVER = 2**63 - 1  # eviction score of slots that must not be chosen
_STAMP_BITS = 40  # LFU score = count << 40 | stamp: counts first, then least recent
_POOL_SHARE = 16  # an LRU scan keeps the oldest 1/16 of the slots as the next victims


class EvictionPolicy:
    """The uses of each slot of a cache and the choice of its victims.

    ``used`` and ``pinned`` are the cache's own per-slot flags (shared, not copied): only
    used, unpinned slots are chosen. ``name`` starts error messages.
    """

    def __init__(
        self,
        policy: str,
        capacity: int,
        device: torch.device,
        *,
        used: torch.Tensor,
        pinned: torch.Tensor,
        name: str,
    ) -> None:
        self._cap = capacity
        self._used, self._pinned, self._name = used, pinned, name
        self.stamp = reserve_zeros(capacity + 1, dtype=torch.int64, device=device)
        self._count = (
            reserve_zeros(capacity + 1, dtype=torch.int64, device=device)
            if policy == "lfu"
            else None
        )
        self._pool = torch.empty(0, dtype=torch.int64, device=device)  # next LRU victims
        self._pool_stamp = torch.empty(0, dtype=torch.int64, device=device)
        self.clock = 0
        self._one = torch.ones((), dtype=torch.int64, device=device)

    @staticmethod
    def bytes_per_slot(policy: str) -> int:
        return 8 + (8 if policy == "lfu" else 0)  # stamp, count

    @property
    def nbytes(self) -> int:
        return self.stamp.nbytes + (self._count.nbytes if self._count is not None else 0)

    def touch(self, slots: torch.Tensor, bump: bool = True) -> None:
        """Record a use of ``slots`` (index ``capacity`` is a sink for misses)."""
        self.clock += bump
        self.stamp.index_fill_(0, slots, self.clock)
        if self._count is not None:
            self._count.index_add_(0, slots, self._one.expand(slots.numel()))

    def admit(self, slots: torch.Tensor) -> None:
        """Start the record of rows just placed in ``slots``."""
        self.stamp[slots] = self.clock
        if self._count is not None:
            self._count[slots] = 1

    def forget_pool(self) -> None:
        """Called when rows are unpinned: they may be older than the pooled ones."""
        self._pool = self._pool[:0]

    def victims(self, n: int, fresh: int, keep: torch.Tensor | None, strict: bool) -> torch.Tensor:
        """Slots of up to ``n`` evictable rows, lowest policy score first, none of ``keep``;
        ``strict``: exactly ``n`` or :class:`CapacityError`. Occupied slots lie below
        ``fresh``. No row is changed."""
        if n == 0:
            return torch.empty(0, dtype=torch.int64, device=self.stamp.device)
        if self._count is None:
            pooled = self._from_pool(n, keep)
            if pooled is not None:
                return pooled
        ok = self._used[:fresh] & ~self._pinned[:fresh]
        if keep is not None and keep.numel():
            ok[keep] = False
        avail = int(ok.sum())
        if avail < n:
            if strict:
                raise CapacityError(
                    f"{self._name}: {n} rows must be displaced but only {avail} of "
                    f"{int(self._used[:fresh].sum())} resident rows can be "
                    f"({int(self._pinned.sum())} pinned); "
                    f"unpin rows, stage fewer keys per pass, or give this tier more memory"
                )
            n = avail
        score = self.stamp[:fresh]
        if self._count is not None:
            count = self._count[:fresh].clamp(max=(1 << (63 - _STAMP_BITS)) - 1)
            score = (count << _STAMP_BITS) | (score & ((1 << _STAMP_BITS) - 1))
            score = score.masked_fill(~ok, _NEVER)
            return torch.topk(score, n, largest=False, sorted=False).indices
        # LRU: take more than asked and keep the rest as a pool for the next evictions.
        k = min(avail, max(n, self._cap // _POOL_SHARE))
        if self.clock < 4 * self._cap:  # stamps span a small range: count instead of sort
            oldest = _lowest_by_histogram(score, ok, k, self.clock + 1)
        else:
            oldest = torch.topk(score.masked_fill(~ok, _NEVER), k, largest=False).indices
        order = torch.argsort(score[oldest])
        self._pool = oldest[order[n:]]
        self._pool_stamp = score[self._pool]
        return oldest[order[:n]]

    def _from_pool(self, n: int, keep: torch.Tensor | None) -> torch.Tensor | None:
        """``n`` LRU victims from the pool, or None if it holds too few valid ones.

        Pooled slots were the oldest when the pool was made. Stamps only grow and new rows get
        the newest, so a pooled slot whose stamp is unchanged is still older than every row
        outside the pool; touched, removed and pinned ones are skipped.
        """
        pool = self._pool
        if pool.numel() < n:
            return None
        valid = self._used[pool] & ~self._pinned[pool] & (self.stamp[pool] == self._pool_stamp)
        if keep is not None and keep.numel():
            valid &= ~torch.isin(pool, keep)
        pool, stamp = pool[valid], self._pool_stamp[valid]
        if pool.numel() < n:
            return None
        self._pool, self._pool_stamp = pool[n:], stamp[n:]  # the pool is sorted by stamp
        return pool[:n]


def _lowest_by_histogram(score: torch.Tensor, ok: torch.Tensor, n: int, span: int) -> torch.Tensor:
    """Indices of ``n`` lowest ``score`` values (in ``[0, span)``) where ``ok``; ties arbitrary.

    A histogram of the scores finds the threshold in linear time, several times faster than
    ``topk`` over millions of slots.
    """
    s = score.masked_fill(~ok, span)  # excluded slots land in a bin past the end
    counts = torch.bincount(s, minlength=span + 1)
    cut = int(torch.searchsorted(counts.cumsum(0), n))  # first score whose bin reaches n
    below = (s < cut).nonzero().squeeze(1)
    tied = (s == cut).nonzero().squeeze(1)[: n - below.numel()]
    return torch.cat([below, tied])

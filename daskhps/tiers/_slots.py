"""The slot cache both in-memory tiers are built on: a row slab, a key index and per-slot metadata.

::

    index  KeyIndex                       key -> slot
    slab   float32[capacity + 1, width]   row of each slot; the last row stays zero and is
                                          what lookups of missing keys gather
    key    int64[capacity]                key of each occupied slot
    used / dirty / pinned  bool[capacity]
    stamp  int64[capacity + 1]            clock of the last use (LRU; LFU tie-break)
    count  int64[capacity + 1]            uses since insertion (LFU only)
    free   int64[capacity]                stack of released slots, ``free[:n_released]``;
                                          slots from ``fresh`` up were never used

The arrays are reserved, not filled: on the CPU they come from the kernel as untouched zero
pages (:func:`reserve_zeros`), and slots are handed out lowest first, so a tier's resident
memory follows the rows it holds, not its capacity (a 4 GiB tier holding 300k rows costs the
process about 40 MiB), and every scan over the slots stops at ``fresh``. The key index starts
small and grows with the keys.

Every one of ``capacity`` slots is usable: the index maps any key to any slot, so, unlike a
set-associative cache, no row is displaced while free slots remain. Eviction picks victims over
the whole cache by last-use stamps (LRU) or use counts (LFU) of unpinned rows: a histogram of
the stamps while they span a small range, else one top-k. An LRU scan also keeps the next
oldest sixteenth of the slots as a pool that serves later evictions without a scan (exact:
stamps only grow). Not thread-safe: callers serialise access (Dask worker threads must not
share a cache without a lock).
"""

from __future__ import annotations

import torch

from daskhps.errors import CapacityError, ConfigError, DataError
from daskhps.tiers.base import Cache, Evicted, Lookup, TierStats, check_keys, check_rows
from daskhps.tiers.index import KeyIndex
from daskhps.tiers.reserve import reserve_zeros

__all__ = ["POLICIES", "SlotCache"]

POLICIES = ("lru", "lfu")
_NEVER = 2**63 - 1  # eviction score of slots that must not be chosen
_STAMP_BITS = 40  # LFU score = count << 40 | stamp: counts first, then least recent
_POOL_SHARE = 16  # an LRU scan keeps the oldest 1/16 of the slots as the next victims
_INDEX_START = 1 << 16  # keys the index is first sized for; it doubles as keys arrive


class SlotCache(Cache):
    """A bounded key -> row cache in one device's memory, evicting by LRU or LFU.

    Parameters
    ----------
    name:
        ``"<table>/<tier>"``, used in error messages.
    width:
        Floats per row.
    capacity_rows:
        Rows held; all of them usable.
    device:
        Where the slab, index and metadata live.
    policy:
        ``"lru"`` (least recently used) or ``"lfu"`` (least frequently used, ties by recency).
    load_factor:
        Index slots per key held at capacity, inverted (see :class:`KeyIndex`).
    pin_memory:
        Allocate the slab in page-locked memory (CPU only) for fast copies to a GPU.
    """

    def __init__(
        self,
        name: str,
        width: int,
        capacity_rows: int,
        *,
        device: torch.device | str = "cpu",
        policy: str = "lru",
        load_factor: float = 0.5,
        pin_memory: bool = False,
    ):
        if width < 1:
            raise ConfigError(f"{name}: row width must be >= 1, got {width}")
        if capacity_rows < 1:
            raise ConfigError(f"{name}: capacity must be at least one row, got {capacity_rows}")
        if policy not in POLICIES:
            raise ConfigError(f"{name}: policy must be one of {POLICIES}, got {policy!r}")
        self.name = name
        self.width = width
        self.device = torch.device(device)
        self.policy = policy
        self._cap = capacity_rows
        dev = self.device
        start = min(capacity_rows, _INDEX_START)
        self._index = KeyIndex(start, device=dev, load_factor=load_factor, most=capacity_rows)
        self._slab = reserve_zeros(
            capacity_rows + 1, width, dtype=torch.float32, device=dev, pin_memory=pin_memory
        )
        self._key = reserve_zeros(capacity_rows, dtype=torch.int64, device=dev)
        self._used = reserve_zeros(capacity_rows, dtype=torch.bool, device=dev)
        self._dirty = reserve_zeros(capacity_rows, dtype=torch.bool, device=dev)
        self._pinned = reserve_zeros(capacity_rows, dtype=torch.bool, device=dev)
        self._stamp = reserve_zeros(capacity_rows + 1, dtype=torch.int64, device=dev)
        self._count = (
            reserve_zeros(capacity_rows + 1, dtype=torch.int64, device=dev)
            if policy == "lfu"
            else None
        )
        self._free = reserve_zeros(capacity_rows, dtype=torch.int64, device=dev)
        self._n_released = 0  # slots in the stack _free[:_n_released]
        self._fresh = 0  # slots below this have held a row; those from it up never have
        self._pool = torch.empty(0, dtype=torch.int64, device=dev)  # next LRU victims
        self._pool_stamp = torch.empty(0, dtype=torch.int64, device=dev)
        self._clock = 0
        self._stats = TierStats()
        self._hits = torch.zeros((), dtype=torch.int64, device=dev)  # summed lazily: no sync
        self._one = torch.ones((), dtype=torch.int64, device=dev)

    @staticmethod
    def bytes_per_row(width: int, policy: str = "lru") -> int:
        """Slab and metadata bytes per row, index excluded."""
        meta = 8 + 3 + 8 + 8  # key, used/dirty/pinned, stamp, free-stack entry
        return 4 * width + meta + (8 if policy == "lfu" else 0)

    # -- Cache ---------------------------------------------------------------------------------

    @property
    def capacity_rows(self) -> int:
        return self._cap

    def __len__(self) -> int:
        return self._cap - self._n_free

    @property
    def _n_free(self) -> int:
        return self._n_released + self._cap - self._fresh

    def _take_free(self, m: int) -> torch.Tensor:
        """``m`` free slots (``m <= _n_free``): the last released first, then never-used ones
        lowest first (so the memory in use stays at the front of every array)."""
        r = min(m, self._n_released)
        s = self._free[self._n_released - r : self._n_released].clone()
        self._n_released -= r
        if m > r:
            fresh = torch.arange(self._fresh, self._fresh + m - r, device=self.device)
            self._fresh += m - r
            s = torch.cat([s, fresh]) if r else fresh
        return s

    @property
    def nbytes(self) -> int:
        parts = [self._slab, self._key, self._used, self._dirty, self._pinned, self._stamp]
        parts += [self._free] + ([self._count] if self._count is not None else [])
        return sum(t.nbytes for t in parts) + self._index.nbytes

    @property
    def stats(self) -> TierStats:
        s = self._stats
        s.hits = s.rows_read = int(self._hits)  # rows read = rows returned by lookups
        s.extra.update(
            rows=len(self),
            capacity_rows=self._cap,
            pinned=self.pinned_count,
            dirty_rows=int(self._dirty.sum()),
            index_bytes=self._index.nbytes,
            index_scratch_bytes=self._index.scratch_bytes,
            index_load=self._index.load,
            bytes=self.nbytes,
        )
        return s

    def keys(self) -> torch.Tensor:
        f = self._fresh
        return self._key[:f][self._used[:f]]

    def lookup(self, keys: torch.Tensor, *, out: torch.Tensor | None = None) -> Lookup:
        keys = self._keys(keys, "lookup")
        n = keys.numel()
        if out is None:
            out = torch.empty(n, self.width, dtype=torch.float32, device=self.device)
        elif (
            out.shape != (n, self.width)
            or out.dtype != torch.float32
            or out.device != self.device
            or not out.is_contiguous()
        ):
            raise DataError(
                f"{self.name}: lookup out= must be a contiguous float32[{n}, {self.width}] on "
                f"{self.device}, "
                f"got {out.dtype}{list(out.shape)} on {out.device}; allocate it to match the keys"
            )
        slots, found = self._index.get(keys, default=self._cap)  # missing: the zero row
        torch.index_select(self._slab, 0, slots, out=out)
        self._touch(slots)
        self._hits += found.sum()
        self._stats.lookups += n
        return Lookup(out, found)

    def upsert(self, keys: torch.Tensor, rows: torch.Tensor, *, dirty: bool = True) -> Evicted:
        keys = self._keys(keys, "upsert")
        rows = check_rows(rows, keys.numel(), self.width, f"{self.name}: upsert").to(self.device)
        self._check_unique(keys)
        slots, found = self._index.get(keys)
        new = (~found).nonzero().squeeze(1)
        old = found.nonzero().squeeze(1)
        m = new.numel()
        if m > self._cap:
            raise CapacityError(
                f"{self.name}: upsert of {m} new rows exceeds the capacity of {self._cap} rows; "
                f"split the batch or give this tier more memory"
            )
        evicted = Evicted.empty(self.width, self.device)
        if m > self._n_free:  # choose victims first: a refused upsert changes nothing
            victims = self._victims(m - self._n_free, keep=slots[old], strict=True)
            evicted = self._remove(victims)
        self._clock += 1
        if old.numel():
            s = slots[old]
            self._slab.index_copy_(0, s, rows[old])
            self._dirty[s] = dirty
            self._touch(s, bump=False)
        if m:
            s = self._take_free(m)
            if m < keys.numel():
                keys, rows = keys[new], rows[new]
            self._place(keys, rows, s, dirty)  # just looked up: all absent
        self._stats.inserts += m
        self._stats.rows_written += m + old.numel()
        return evicted

    def _place(
        self, keys: torch.Tensor, rows: torch.Tensor, s: torch.Tensor, dirty: bool | torch.Tensor
    ) -> None:
        """Put ``keys`` (absent from the index) and their rows into the free slots ``s``."""
        self._index.put(keys, s, absent=True)
        self._slab.index_copy_(0, s, rows)
        self._key[s] = keys
        self._used[s] = True
        self._dirty[s] = dirty
        self._stamp[s] = self._clock
        if self._count is not None:
            self._count[s] = 1

    def evict(self, keys: torch.Tensor | None = None, n: int | None = None) -> Evicted:
        if (keys is None) == (n is None):
            raise DataError(f"{self.name}: evict takes keys= or n=, exactly one of them")
        if keys is not None:
            keys = self._keys(keys, "evict")
            slots, found = self._index.get(keys)
            slots = torch.unique(slots[found])
            if bool(self._pinned[slots].any()):
                raise DataError(
                    f"{self.name}: cannot evict pinned rows (e.g. key "
                    f"{int(self._key[slots[self._pinned[slots]][0]])}); call unpin_all() first"
                )
            return self._remove(slots)
        if n is None or n < 0:
            raise DataError(f"{self.name}: evict n must be >= 0, got {n}")
        return self._remove(self._victims(n, keep=None, strict=False))

    def flush(self) -> Evicted:
        slots = self._dirty[: self._fresh].nonzero().squeeze(1)
        self._dirty[slots] = False
        return Evicted(
            self._key[slots], self._slab[slots], torch.ones_like(slots, dtype=torch.bool)
        )

    # -- slots: rows updated in place, pins -----------------------------------------------------

    @property
    def rows(self) -> torch.Tensor:
        return self._slab[: self._cap]

    def find_slots(self, keys: torch.Tensor, *, touch: bool = False) -> torch.Tensor:
        keys = self._keys(keys, "find_slots")
        slots, found = self._index.get(keys)
        if touch:
            self._touch(torch.where(found, slots, self._cap))
        return slots

    def mark_dirty(self, slots: torch.Tensor) -> None:
        if not isinstance(slots, torch.Tensor) or slots.dtype != torch.int64 or slots.dim() != 1:
            raise DataError(f"{self.name}: mark_dirty takes a 1-D int64 tensor of slots")
        slots = slots.to(self.device)
        if slots.numel() and (
            int(slots.min()) < 0
            or int(slots.max()) >= self._cap
            or not bool(self._used[slots].all())
        ):
            raise DataError(
                f"{self.name}: mark_dirty got slots that hold no row; pass slots returned by "
                f"find_slots for present keys (drop the -1 entries)"
            )
        self._dirty[slots] = True

    def pin(self, keys: torch.Tensor) -> torch.Tensor:
        """Protect the rows of ``keys`` from eviction until :meth:`unpin_all`; returns found.
        (:meth:`pin_slots` with the lookup; the table pins slots it already has.)"""
        keys = self._keys(keys, "pin")
        slots, found = self._index.get(keys)
        self._pinned[slots[found]] = True
        return found

    def unpin_all(self) -> None:
        self._pinned[: self._fresh].zero_()
        self._pool = self._pool[:0]  # unpinned rows may be older than the pooled ones

    @property
    def pinned_count(self) -> int:
        return int(self._pinned.sum())

    # -- slot-level operations (the table's staging: no second hash lookup) --------------------

    def distinct_slots(self, slots: torch.Tensor) -> torch.Tensor:
        # A mark per slot instead of a sort: linear in the keys and the capacity, several times
        # faster than torch.unique over a pass's million keys.
        # Occupied slots all lie below `fresh`.
        mark = torch.zeros(self._fresh, dtype=torch.bool, device=self.device)
        mark[slots] = True
        return mark.nonzero().squeeze(1)

    def keys_at(self, slots: torch.Tensor) -> torch.Tensor:
        """Keys held in ``slots`` (occupied slots)."""
        return self._key[slots]

    def touch(self, slots: torch.Tensor) -> None:
        self._touch(slots)

    def pinned_at(self, slots: torch.Tensor) -> torch.Tensor:
        return self._pinned[slots]

    def dirty_at(self, slots: torch.Tensor) -> torch.Tensor:
        return self._dirty[slots]

    def pin_slots(self, slots: torch.Tensor) -> None:
        self._pinned[slots] = True

    def unpin_slots(self, slots: torch.Tensor) -> None:
        self._pinned[slots] = False
        self._pool = self._pool[:0]  # unpinned rows may be older than the pooled ones

    def insert_new(
        self, keys: torch.Tensor, rows: torch.Tensor, dirty: torch.Tensor
    ) -> tuple[torch.Tensor, Evicted]:
        keys = self._keys(keys, "insert_new")
        m = keys.numel()
        rows = check_rows(rows, m, self.width, f"{self.name}: insert_new").to(self.device)
        dirty = dirty.to(self.device, torch.bool)
        if dirty.shape != (m,):
            raise DataError(
                f"{self.name}: insert_new needs one dirty flag per key, got {dirty.shape}"
            )
        if m > self._cap:
            raise CapacityError(
                f"{self.name}: insert of {m} new rows exceeds the capacity of {self._cap} rows; "
                f"split the batch or give this tier more memory"
            )
        evicted = Evicted.empty(self.width, self.device)
        if m > self._n_free:
            evicted = self._remove(self._victims(m - self._n_free, keep=None, strict=True))
        self._clock += 1
        s = self._take_free(m)
        if m:
            self._place(keys, rows, s, dirty)
        self._stats.inserts += m
        self._stats.rows_written += m
        return s, evicted

    def take(self, keys: torch.Tensor) -> tuple[torch.Tensor, Evicted]:
        keys = self._keys(keys, "take")
        slots, found = self._index.get(keys)
        slots = slots[found]
        if bool(self._pinned[slots].any()):
            raise DataError(
                f"{self.name}: cannot take pinned rows (e.g. key "
                f"{int(self._key[slots[self._pinned[slots]][0]])}); call unpin_all() first"
            )
        return found, self._remove(slots)

    # -- internals -----------------------------------------------------------------------------

    def _keys(self, keys: object, op: str) -> torch.Tensor:
        return check_keys(keys, f"{self.name}: {op}").to(self.device)

    def _check_unique(self, keys: torch.Tensor) -> None:
        if keys.numel() < 2:
            return
        s = keys.sort().values
        dup = (s[1:] == s[:-1]).nonzero()
        if dup.numel():
            raise DataError(
                f"{self.name}: duplicate key {int(s[dup[0, 0]])} in one upsert; keys must be "
                f"unique: deduplicate first (torch.unique) and combine their rows"
            )

    def _touch(self, slots: torch.Tensor, bump: bool = True) -> None:
        """Record a use of ``slots`` (index ``capacity`` is a sink for misses)."""
        self._clock += bump
        self._stamp.index_fill_(0, slots, self._clock)
        if self._count is not None:
            self._count.index_add_(0, slots, self._one.expand(slots.numel()))

    def _victims(self, n: int, keep: torch.Tensor | None, strict: bool) -> torch.Tensor:
        """Slots of up to ``n`` evictable rows, lowest policy score first; none are changed."""
        if n == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        if self._count is None:
            pooled = self._from_pool(n, keep)
            if pooled is not None:
                return pooled
        f = self._fresh  # every occupied slot lies below it
        ok = self._used[:f] & ~self._pinned[:f]
        if keep is not None and keep.numel():
            ok[keep] = False
        avail = int(ok.sum())
        if avail < n:
            if strict:
                raise CapacityError(
                    f"{self.name}: {n} rows must be displaced but only {avail} of "
                    f"{len(self)} resident rows can be ({self.pinned_count} pinned); "
                    f"unpin rows, stage fewer keys per pass, or give this tier more memory"
                )
            n = avail
        score = self._stamp[:f]
        if self._count is not None:
            count = self._count[:f].clamp(max=(1 << (63 - _STAMP_BITS)) - 1)
            score = (count << _STAMP_BITS) | (score & ((1 << _STAMP_BITS) - 1))
            score = score.masked_fill(~ok, _NEVER)
            return torch.topk(score, n, largest=False, sorted=False).indices
        # LRU: take more than asked and keep the rest as a pool for the next evictions.
        k = min(avail, max(n, self._cap // _POOL_SHARE))
        if self._clock < 4 * self._cap:  # stamps span a small range: count instead of sort
            oldest = _lowest_by_histogram(score, ok, k, self._clock + 1)
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
        valid = self._used[pool] & ~self._pinned[pool] & (self._stamp[pool] == self._pool_stamp)
        if keep is not None and keep.numel():
            valid &= ~torch.isin(pool, keep)
        pool, stamp = pool[valid], self._pool_stamp[valid]
        if pool.numel() < n:
            return None
        self._pool, self._pool_stamp = pool[n:], stamp[n:]  # the pool is sorted by stamp
        return pool[:n]

    def _remove(self, slots: torch.Tensor) -> Evicted:
        """Take the rows of ``slots`` out (copies) and free the slots."""
        out = Evicted(self._key[slots], self._slab.index_select(0, slots), self._dirty[slots])
        k = slots.numel()
        if k:
            self._index.delete(out.keys)
            self._used[slots] = False
            self._dirty[slots] = False
            self._pinned[slots] = False
            # Freed in slot order whatever the caller's order, so that the same rows removed by
            # different calls (take, evict) leave the same free list and later inserts land in
            # the same slots: victims among equal LRU/LFU scores then match too.
            self._free[self._n_released : self._n_released + k] = torch.sort(slots).values
            self._n_released += k
            self._stats.evictions += k
        return out


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

"""The slot cache both in-memory tiers are built on: a bounded key -> row map over slots.

::

    rows    SlotRows         key index, row slab, each slot's key and used/dirty/pinned flags,
                             free slots (tiers/slot_rows.py, tiers/free_slots.py)
    policy  EvictionPolicy   each slot's last use (and use count), victims (tiers/eviction.py)

The arrays are reserved, not filled: on the CPU they come from the kernel as untouched zero
pages (:func:`~daskhps.tiers.reserve.reserve_zeros`), and slots are handed out lowest first,
so a tier's resident memory follows the rows it holds, not its capacity (a 4 GiB tier holding
300k rows costs the process about 40 MiB), and every scan over the slots stops at the first
never-used one.

Every one of ``capacity`` slots is usable: the index maps any key to any slot, so, unlike a
set-associative cache, no row is displaced while free slots remain. Not thread-safe: callers
serialise access (Dask worker threads must not share a cache without a lock).
"""

from __future__ import annotations

import torch

from daskhps.errors import CapacityError, ConfigError, DataError
from daskhps.tiers.base import Cache, Evicted, Lookup, TierStats, check_keys, check_rows
from daskhps.tiers.eviction import POLICIES, EvictionPolicy
from daskhps.tiers.slot_rows import SlotRows

__all__ = ["SlotCache", "bytes_per_row"]


def bytes_per_row(width: int, policy: str = "lru") -> int:
    """Slab and metadata bytes per row of a :class:`SlotCache`, index excluded."""
    return SlotRows.bytes_per_row(width) + EvictionPolicy.bytes_per_slot(policy)


class SlotCache(Cache):
    """A bounded key -> row cache in one device's memory, evicting by LRU or LFU.

    Parameters
    ----------
    name:
        ``"<table>/<tier>"``, used in error messages.
    width:
        Floats per row (embedding dim plus optimizer state).
    capacity_rows:
        Rows held; all of them usable.
    device:
        Where the slab, index and metadata live.
    policy:
        ``"lru"`` (least recently used, the default) or ``"lfu"`` (least frequently used,
        ties by recency); lookup hits count as uses.
    load_factor:
        Index load at full capacity, lower is faster and larger (see :class:`KeyIndex`).
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
        self._rows = r = SlotRows(
            width, capacity_rows, self.device, load_factor=load_factor, pin_memory=pin_memory
        )
        # The arrays every operation reads, under short names (the same tensors).
        self._index, self._slab, self._key = r.index, r.slab, r.key
        self._used, self._dirty, self._pinned, self._free = r.used, r.dirty, r.pinned, r.free
        self._policy = EvictionPolicy(
            policy, capacity_rows, self.device, used=r.used, pinned=r.pinned, name=name
        )
        self._stats = TierStats()
        self._hits = torch.zeros((), dtype=torch.int64, device=self.device)  # summed lazily

    # -- Cache ---------------------------------------------------------------------------------

    @property
    def capacity_rows(self) -> int:
        return self._cap

    def __len__(self) -> int:
        return self._cap - len(self._free)

    @property
    def nbytes(self) -> int:
        return self._rows.nbytes + self._policy.nbytes

    @property
    def stats(self) -> TierStats:
        s = self._stats
        s.hits = s.rows_read = int(self._hits)  # rows read = rows returned by lookups
        s.evictions = self._rows.removed
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
        f = self._free.fresh
        return self._key[:f][self._used[:f]]

    def lookup(self, keys: torch.Tensor, *, out: torch.Tensor | None = None) -> Lookup:
        keys = check_keys(keys, f"{self.name}: lookup", self.device)
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
        self._policy.touch(slots)
        self._hits += found.sum()
        self._stats.lookups += n
        return Lookup(out, found)

    def upsert(self, keys: torch.Tensor, rows: torch.Tensor, *, dirty: bool = True) -> Evicted:
        keys = check_keys(keys, f"{self.name}: upsert", self.device)
        rows = check_rows(rows, keys.numel(), self.width, f"{self.name}: upsert").to(self.device)
        _check_unique(keys, self.name)
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
        if m > len(self._free):  # choose victims first: a refused upsert changes nothing
            need = m - len(self._free)
            victims = self._policy.victims(need, self._free.fresh, slots[old], strict=True)
            evicted = self._rows.remove(victims)
        self._policy.clock += 1
        if old.numel():
            s = slots[old]
            self._slab.index_copy_(0, s, rows[old])
            self._dirty[s] = dirty
            self._policy.touch(s, bump=False)
        if m:
            if m < keys.numel():
                keys, rows = keys[new], rows[new]
            self._policy.admit(self._rows.place(keys, rows, dirty))  # just looked up: absent
        self._stats.inserts += m
        self._stats.rows_written += m + old.numel()
        return evicted

    def evict(self, keys: torch.Tensor | None = None, n: int | None = None) -> Evicted:
        if (keys is None) == (n is None):
            raise DataError(f"{self.name}: evict takes keys= or n=, exactly one of them")
        if keys is not None:
            keys = check_keys(keys, f"{self.name}: evict", self.device)
            slots, found = self._index.get(keys)
            slots = torch.unique(slots[found])
            if bool(self._pinned[slots].any()):
                raise DataError(
                    f"{self.name}: cannot evict pinned rows (e.g. key "
                    f"{int(self._key[slots[self._pinned[slots]][0]])}); call unpin_all() first"
                )
            return self._rows.remove(slots)
        if n is None or n < 0:
            raise DataError(f"{self.name}: evict n must be >= 0, got {n}")
        return self._rows.remove(self._policy.victims(n, self._free.fresh, None, strict=False))

    def flush(self, limit: int | None = None) -> Evicted:
        slots = self._dirty[: self._free.fresh].nonzero().squeeze(1)
        if limit is not None:
            slots = slots[: max(limit, 0)]
        self._dirty[slots] = False
        return Evicted(
            self._key[slots], self._slab[slots], torch.ones_like(slots, dtype=torch.bool)
        )

    # -- slots: rows updated in place, pins -----------------------------------------------------

    @property
    def rows(self) -> torch.Tensor:
        return self._slab[: self._cap]

    def find_slots(self, keys: torch.Tensor, *, touch: bool = False) -> torch.Tensor:
        keys = check_keys(keys, f"{self.name}: find_slots", self.device)
        slots, found = self._index.get(keys)
        if touch:
            self._policy.touch(torch.where(found, slots, self._cap))
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
        keys = check_keys(keys, f"{self.name}: pin", self.device)
        slots, found = self._index.get(keys)
        self._pinned[slots[found]] = True
        return found

    def unpin_all(self) -> None:
        self._pinned[: self._free.fresh].zero_()
        self._policy.forget_pool()

    @property
    def pinned_count(self) -> int:
        return int(self._pinned.sum())

    # -- slot-level operations (the table's staging: no second hash lookup) --------------------

    def distinct_slots(self, slots: torch.Tensor) -> torch.Tensor:
        # A mark per slot instead of a sort: linear in the keys and the capacity, several times
        # faster than torch.unique over a pass's million keys.
        # Occupied slots all lie below `fresh`.
        mark = torch.zeros(self._free.fresh, dtype=torch.bool, device=self.device)
        mark[slots] = True
        return mark.nonzero().squeeze(1)

    def keys_at(self, slots: torch.Tensor) -> torch.Tensor:
        """Keys held in ``slots`` (occupied slots)."""
        return self._key[slots]

    def touch(self, slots: torch.Tensor) -> None:
        self._policy.touch(slots)

    def pinned_at(self, slots: torch.Tensor) -> torch.Tensor:
        return self._pinned[slots]

    def dirty_at(self, slots: torch.Tensor) -> torch.Tensor:
        return self._dirty[slots]

    def pin_slots(self, slots: torch.Tensor) -> None:
        self._pinned[slots] = True

    def unpin_slots(self, slots: torch.Tensor) -> None:
        self._pinned[slots] = False
        self._policy.forget_pool()

    def insert_new(
        self, keys: torch.Tensor, rows: torch.Tensor, dirty: torch.Tensor
    ) -> tuple[torch.Tensor, Evicted]:
        keys = check_keys(keys, f"{self.name}: insert_new", self.device)
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
        if m > len(self._free):
            need = m - len(self._free)
            evicted = self._rows.remove(
                self._policy.victims(need, self._free.fresh, None, strict=True)
            )
        self._policy.clock += 1
        s = self._rows.place(keys, rows, dirty)
        if m:
            self._policy.admit(s)
        self._stats.inserts += m
        self._stats.rows_written += m
        return s, evicted

    def take(self, keys: torch.Tensor) -> tuple[torch.Tensor, Evicted]:
        keys = check_keys(keys, f"{self.name}: take", self.device)
        slots, found = self._index.get(keys)
        slots = slots[found]
        if bool(self._pinned[slots].any()):
            raise DataError(
                f"{self.name}: cannot take pinned rows (e.g. key "
                f"{int(self._key[slots[self._pinned[slots]][0]])}); call unpin_all() first"
            )
        return found, self._rows.remove(slots)


def _check_unique(keys: torch.Tensor, name: str) -> None:
    if keys.numel() < 2:
        return
    s = keys.sort().values
    dup = (s[1:] == s[:-1]).nonzero()
    if dup.numel():
        raise DataError(
            f"{name}: duplicate key {int(s[dup[0, 0]])} in one upsert; keys must be "
            f"unique: deduplicate first (torch.unique) and combine their rows"
        )

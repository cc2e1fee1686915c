"""Where each row of a slot cache lives: the key index, the row slab, each slot's key and flags.

::

    index  KeyIndex                       key -> slot
    slab   float32[capacity + 1, width]   row of each slot; the last row stays zero and is
                                          what lookups of missing keys gather
    key    int64[capacity]                key of each occupied slot
    used / dirty / pinned  bool[capacity]
    free   FreeSlots                      slots that hold no row

The arrays are reserved, not filled (:func:`~daskhps.tiers.reserve.reserve_zeros`), and slots
are handed out lowest first, so a tier's resident memory follows the rows it holds, not its
capacity. The key index starts small and grows with the keys.
"""

from __future__ import annotations

import torch

from daskhps.tiers.base import Evicted
from daskhps.tiers.free_slots import FreeSlots
from daskhps.tiers.index import KeyIndex
from daskhps.tiers.reserve import reserve_zeros

__all__ = ["SlotRows"]

_INDEX_START = 1 << 16  # keys the index is first sized for; it doubles as keys arrive


class SlotRows:
    """The rows of ``capacity`` slots of ``width`` floats on ``device``, and their keys."""

    def __init__(
        self,
        width: int,
        capacity: int,
        device: torch.device,
        *,
        load_factor: float,
        pin_memory: bool,
    ) -> None:
        start = min(capacity, _INDEX_START)
        self.index = KeyIndex(start, device=device, load_factor=load_factor, most=capacity)
        self.slab = reserve_zeros(
            capacity + 1, width, dtype=torch.float32, device=device, pin_memory=pin_memory
        )
        self.key = reserve_zeros(capacity, dtype=torch.int64, device=device)
        self.used = reserve_zeros(capacity, dtype=torch.bool, device=device)
        self.dirty = reserve_zeros(capacity, dtype=torch.bool, device=device)
        self.pinned = reserve_zeros(capacity, dtype=torch.bool, device=device)
        self.free = FreeSlots(capacity, device)
        self.removed = 0  # rows taken out since creation

    @staticmethod
    def bytes_per_row(width: int) -> int:
        """Slab and per-slot bytes of one row, index excluded."""
        return 4 * width + 8 + 3 + FreeSlots.BYTES_PER_SLOT  # row, key, flags, free entry

    @property
    def nbytes(self) -> int:
        parts = [self.slab, self.key, self.used, self.dirty, self.pinned]
        return sum(t.nbytes for t in parts) + self.free.nbytes + self.index.nbytes

    def place(
        self, keys: torch.Tensor, rows: torch.Tensor, dirty: bool | torch.Tensor
    ) -> torch.Tensor:
        """Put ``keys`` (absent from the index, at most as many as free slots) and their rows
        into free slots; returns the slots."""
        s = self.free.take(keys.numel())
        if keys.numel():
            self.index.put(keys, s, absent=True)
            self.slab.index_copy_(0, s, rows)
            self.key[s] = keys
            self.used[s] = True
            self.dirty[s] = dirty
        return s

    def remove(self, slots: torch.Tensor) -> Evicted:
        """Take the rows of ``slots`` (occupied, distinct) out (copies) and free the slots."""
        out = Evicted(self.key[slots], self.slab.index_select(0, slots), self.dirty[slots])
        if slots.numel():
            self.index.delete(out.keys)
            self.used[slots] = False
            self.dirty[slots] = False
            self.pinned[slots] = False
            self.free.release(slots)
            self.removed += slots.numel()
        return out

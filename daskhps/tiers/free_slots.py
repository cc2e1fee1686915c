"""The free slots of a slot cache: a stack of released slots, then the never-used ones.

::

    stack  int64[capacity]   released slots, ``stack[:released]``
    fresh  int               slots from here up were never used

Never-used slots are handed out lowest first, so the memory in use stays at the front of
every per-slot array and every scan over the slots stops at :attr:`FreeSlots.fresh`.
"""

from __future__ import annotations

import torch

from daskhps.tiers.reserve import reserve_zeros

__all__ = ["FreeSlots"]


class FreeSlots:
    """Which of ``capacity`` slots hold no row."""

    BYTES_PER_SLOT = 8  # one stack entry

    def __init__(self, capacity: int, device: torch.device) -> None:
        self._cap = capacity
        self._device = device
        self._stack = reserve_zeros(capacity, dtype=torch.int64, device=device)
        self._released = 0
        self.fresh = 0  # slots below this have held a row; those from it up never have

    def __len__(self) -> int:
        return self._released + self._cap - self.fresh

    @property
    def nbytes(self) -> int:
        return self._stack.nbytes

    def take(self, m: int) -> torch.Tensor:
        """``m`` free slots (``m <= len(self)``): the last released first, then never-used
        ones lowest first."""
        r = min(m, self._released)
        s = self._stack[self._released - r : self._released].clone()
        self._released -= r
        if m > r:
            fresh = torch.arange(self.fresh, self.fresh + m - r, device=self._device)
            self.fresh += m - r
            s = torch.cat([s, fresh]) if r else fresh
        return s

    def release(self, slots: torch.Tensor) -> None:
        """Free ``slots`` (occupied, distinct)."""
        k = slots.numel()
        # Freed in slot order whatever the caller's order, so that the same rows removed by
        # different calls (take, evict) leave the same free list and later inserts land in
        # the same slots: victims among equal LRU/LFU scores then match too.
        self._stack[self._released : self._released + k] = torch.sort(slots).values
        self._released += k

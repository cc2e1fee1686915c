"""Host memory: the middle tier, a bounded cache in CPU memory sized in bytes.

The trainer gives it a share of the Dask worker's memory limit. The row capacity is derived
honestly from that budget: each row costs its floats (``4 * width`` bytes) plus its slot
metadata and its share of the key index, and :attr:`HostMemory.nbytes` never exceeds the
budget. Lookups also reuse scratch buffers of about 100 bytes per key of the largest batch (at
most half a million keys at once), reported as ``index_scratch_bytes`` in ``stats.extra``.
Where CUDA is available the slab can sit in page-locked memory, so copies to the device cache
run at full speed.
"""

from __future__ import annotations

import torch

from daskhps.errors import ConfigError
from daskhps.tiers._slots import SlotCache, bytes_per_row
from daskhps.tiers.index import KeyIndex

__all__ = ["HostMemory"]


def rows_for_bytes(
    width: int, capacity_bytes: int, policy: str = "lru", load_factor: float = 0.5
) -> int:
    """Most rows whose slab, metadata and index fit in ``capacity_bytes``."""

    def cost(rows: int) -> int:
        fixed = 4 * width + 8 + (8 if policy == "lfu" else 0)  # zero row and sink entries
        per_row = bytes_per_row(width, policy)
        return fixed + rows * per_row + KeyIndex.nbytes_for(rows, load_factor)

    lo, hi = 0, max(0, capacity_bytes) // bytes_per_row(width, policy) + 1
    while lo < hi:  # cost is monotone in rows
        mid = (lo + hi + 1) // 2
        if cost(mid) <= capacity_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


class HostMemory(SlotCache):
    """Key -> row cache in CPU memory holding as many rows as ``capacity_bytes`` allows.

    The parameters are :class:`SlotCache`'s (name ``"<table>/host"``), except:

    capacity_bytes:
        Memory budget for rows, metadata and index together (instead of ``capacity_rows``).
    pin_memory:
        Page-locked slab for fast host -> device copies; default: when CUDA is available.
    """

    def __init__(
        self,
        name: str,
        width: int,
        capacity_bytes: int,
        *,
        policy: str = "lru",
        pin_memory: bool | None = None,
        load_factor: float = 0.5,
    ):
        if width < 1:
            raise ConfigError(f"{name}: row width must be >= 1, got {width}")
        rows = rows_for_bytes(width, capacity_bytes, policy, load_factor)
        if rows < 1:
            raise ConfigError(
                f"{name}: {capacity_bytes} bytes hold no row of width {width} (a row with its "
                f"metadata and index takes about {bytes_per_row(width, policy) + 64} "
                f"bytes); give the host tier a larger share of the worker's memory"
            )
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        super().__init__(
            name,
            width,
            rows,
            device="cpu",
            policy=policy,
            load_factor=load_factor,
            pin_memory=pin_memory,
        )
        self.capacity_bytes = capacity_bytes

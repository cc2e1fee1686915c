"""The device cache: the top tier, in GPU memory (or CPU memory on a machine without a GPU).

Rows live in one preallocated ``float32[capacity_rows, width]`` slab; a vectorised hash index
maps keys to slots. The capacity is exact: the index is sized so that every one of
``capacity_rows`` slots is usable and no row is displaced while a slot is free (no capacity is
lost to associativity, as in a set-associative cache). The index costs about
``16 / load_factor`` bytes per row on top (``index_bytes`` and ``index_load`` in
``stats.extra``).

Training updates rows in place: :meth:`~DeviceCache.find_slots` gives slots into
:attr:`~DeviceCache.rows`, :meth:`~DeviceCache.mark_dirty` records the change, and
:meth:`~DeviceCache.pin` keeps a pass's working set resident until
:meth:`~DeviceCache.unpin_all`.
"""

from __future__ import annotations

import torch

from daskhps.tiers._slots import SlotCache

__all__ = ["DeviceCache"]


class DeviceCache(SlotCache):
    """Key -> row cache of exactly ``capacity_rows`` rows on ``device``, LRU or LFU.

    Parameters
    ----------
    name:
        ``"<table>/device"``, used in error messages.
    width:
        Floats per row (embedding dim plus optimizer state).
    capacity_rows:
        Rows held, all usable.
    device:
        ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a :class:`torch.device`.
    policy:
        ``"lru"`` (default) or ``"lfu"``; lookup hits count as uses.
    load_factor:
        Index load at full capacity; lower is faster and larger.
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
    ):
        super().__init__(
            name, width, capacity_rows, device=device, policy=policy, load_factor=load_factor
        )

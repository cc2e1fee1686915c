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

from daskhps.tiers._slots import SlotCache

__all__ = ["DeviceCache"]


class DeviceCache(SlotCache):
    """Key -> row cache of exactly ``capacity_rows`` rows on ``device`` (``"cpu"``,
    ``"cuda"``, ``"cuda:1"`` or a :class:`torch.device`), LRU or LFU; its parameters are
    :class:`SlotCache`'s, its name ``"<table>/device"``."""

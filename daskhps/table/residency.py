"""Rows resident in the device tier: training lookups, read-only peeks, and staging a pass's
working set (pinned until the pass ends). Rows the device misses come up the read path
(:mod:`daskhps.table.read_path`), displacing unpinned rows down the hierarchy."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from daskhps.errors import CapacityError
from daskhps.table.shard import Shard
from daskhps.tiers.base import Cache

__all__ = [
    "StageReport",
    "lookup_rows",
    "peek",
    "promote",
    "resident_slots",
    "stage",
    "unique_keys",
]


@dataclass(frozen=True)
class StageReport:
    """Where the rows of a staged working set came from."""

    rows: int
    from_device: int
    from_host: int
    from_store: int
    initialised: int
    pinned: int


def unique_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``torch.unique(keys, return_inverse=True)``, with ``None`` for the inverse when ``keys``
    are already strictly increasing (what :meth:`Exchange.route` hands each owner): one
    comparison instead of a sort."""
    if keys.numel() < 2 or bool((keys[1:] > keys[:-1]).all()):
        return keys, None
    ukeys, inv = torch.unique(keys, return_inverse=True)
    return ukeys, inv


def peek(shard: Shard, keys: torch.Tensor) -> torch.Tensor:
    """Full rows of ``keys`` without changing any tier."""
    keys = shard.device_keys(keys, "peek")
    ukeys, inv = unique_keys(keys)
    got = shard.device_cache.lookup(ukeys)
    rows, found = got.rows, got.found
    if not bool(found.all()):
        miss = (~found).nonzero().squeeze(1)
        rows[miss] = shard.read.read(ukeys[miss])
    return rows if inv is None else rows[inv]


def lookup_rows(shard: Shard, keys: torch.Tensor) -> torch.Tensor:
    """Full rows of ``keys``, made resident in the device tier first."""
    shard.check_writable("lookup")
    keys = shard.device_keys(keys, "lookup")
    ukeys, inv = unique_keys(keys)
    slots = resident_slots(shard, ukeys, "lookup")
    rows = shard.device_cache.rows.index_select(0, slots)
    return rows if inv is None else rows[inv]


def resident_slots(shard: Shard, ukeys: torch.Tensor, op: str) -> torch.Tensor:
    """Device slots of unique keys, promoting missing rows from below first."""
    cache = shard.device_cache
    slots = cache.find_slots(ukeys, touch=True)
    hit = slots >= 0
    n_hit = int(hit.sum())
    shard.sources["device"] += n_hit
    if n_hit == len(ukeys):
        return slots
    hit_slots = slots[hit]
    # This batch's resident rows must not be displaced by its own missing ones (LFU could
    # pick them): pin them for the insert, then release only those pins.
    fresh = hit_slots[~cache.pinned_at(hit_slots)]
    pinned = cache.pinned_count
    unpinned = len(ukeys) - (n_hit - len(fresh))
    if unpinned > cache.capacity_rows - pinned:
        raise CapacityError(
            f"{shard.where(op)}: {len(ukeys):,} unique keys ({unpinned:,} not pinned) do not "
            f"fit the device tier of {cache.capacity_rows:,} rows with {pinned:,} "
            "pinned; stage the pass's keys first, use smaller batches or a larger device tier"
        )
    miss = ~hit
    cache.pin_slots(fresh)
    try:
        new_slots = promote(shard, ukeys[miss])
    finally:
        cache.unpin_slots(fresh)
    slots = slots.clone()
    slots[miss] = new_slots
    return slots


def promote(shard: Shard, mkeys: torch.Tensor) -> torch.Tensor:
    """Bring unique keys missing from the device tier into it (displacing unpinned rows
    down the hierarchy, see :mod:`daskhps.table.read_path`); returns their slots. The
    caller checked that they fit."""
    return shard.read.promote(mkeys)[0]


def stage(shard: Shard, keys: torch.Tensor) -> StageReport:
    """Make a pass's working set resident in the device tier and pin it there (see
    :meth:`daskhps.table.EmbeddingTable.stage`)."""
    shard.check_writable("stage")
    keys = shard.device_keys(keys, "stage")
    cache = shard.device_cache
    hit_slots, mkeys = _split_resident(cache, keys)
    fresh = hit_slots[~cache.pinned_at(hit_slots)]  # resident, not pinned yet
    rows = len(hit_slots) + len(mkeys)
    _check_stage_fits(shard, rows, len(fresh) + len(mkeys))
    before = dict(shard.sources)
    cache.touch(hit_slots)
    shard.sources["device"] += len(hit_slots)
    cache.pin_slots(fresh)
    if len(mkeys):
        try:
            cache.pin_slots(promote(shard, mkeys))
        except BaseException:
            cache.unpin_slots(fresh)
            raise
    got = {k: shard.sources[k] - before[k] for k in before}
    return StageReport(
        rows=rows,
        from_device=got["device"],
        from_host=got["host"],
        from_store=got["store"],
        initialised=got["init"],
        pinned=cache.pinned_count,
    )


def _split_resident(cache: Cache, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct device slots of the resident ``keys``, and the missing keys, unique.
    Resident rows cost one hash lookup per key: only the missing keys are sorted."""
    slots = cache.find_slots(keys)
    hit = slots >= 0
    if int(hit.sum()) == len(keys):
        return cache.distinct_slots(slots), keys[:0]
    return cache.distinct_slots(slots[hit]), torch.unique(keys[~hit])


def _check_stage_fits(shard: Shard, rows: int, new: int) -> None:
    """:class:`CapacityError` unless ``new`` more pinned rows fit the device tier."""
    cache = shard.device_cache
    pinned, cap = cache.pinned_count, cache.capacity_rows
    if pinned + new > cap:
        raise CapacityError(
            f"table {shard.spec.name!r}: staging {rows:,} rows "
            f"({new:,} new, {pinned:,} already pinned) does not fit the "
            f"device tier of {cap:,} rows x {shard.spec.row_bytes} bytes; "
            "raise the device tier's size or lower passes.max_working_set"
        )

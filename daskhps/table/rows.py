"""Which keys hold a row of the table, and the rows' own lifecycle: what admission
(:mod:`daskhps.table.admission`) and expiry (:mod:`daskhps.table.expiry`) ask of a shard.

A key resident in a cache whose slot is clean and which the store lacks has no row: its slot
holds only the initial value, which re-initialising gives again."""

from __future__ import annotations

import torch

from daskhps.errors import DataError
from daskhps.table.read_path import initial_rows
from daskhps.table.shard import Shard
from daskhps.table.stats import row_stats
from daskhps.tiers.base import Cache, check_keys

__all__ = ["frozen_mask", "has_row", "remove", "row_statistics", "staged_slots", "without_rows"]

_ROWS_PER_SCAN = 1 << 20  # store rows read at once by row_statistics


def has_row(shard: Shard, tier: Cache, keys: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Whether each key resident in ``tier`` (at ``slots``) holds a row of the table: one
    changed since it was written down, or one the store has. The store is asked about the
    clean ones only."""
    out = tier.dirty_at(slots).clone()
    clean = (~out).nonzero().squeeze(1)
    if len(clean):
        out[clean] = shard.store.contains(keys[clean].cpu()).to(out.device)
    return out


def staged_slots(shard: Shard, keys: torch.Tensor, op: str) -> torch.Tensor:
    """Device slots of ``keys``; a key not resident is a :class:`DataError`."""
    slots = shard.device_cache.find_slots(keys)
    if len(slots) and int(slots.min()) < 0:
        bad = int(keys[slots < 0][0])
        raise DataError(f"{shard.where(op)}: key {bad} is not staged; stage the pass first")
    return slots


def without_rows(shard: Shard, keys: torch.Tensor) -> torch.Tensor:
    """Which of the staged ``keys`` have no row of the table yet."""
    keys = shard.device_keys(keys, "without_rows")
    return ~has_row(shard, shard.device_cache, keys, staged_slots(shard, keys, "without_rows"))


def frozen_mask(shard: Shard, keys: torch.Tensor) -> torch.Tensor | None:
    """Per device slot, whether it holds one of the staged ``keys`` (None: none does)."""
    keys = shard.device_keys(keys, "freeze")
    frozen = torch.zeros(shard.device_cache.capacity_rows, dtype=torch.bool, device=shard.device)
    frozen[staged_slots(shard, keys, "freeze")] = True
    return frozen if bool(frozen.any()) else None


def row_statistics(shard: Shard) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(keys, count, last_day)`` of every row of the shard, each from its freshest copy."""
    parts, held = _resident_rows(shard)
    stored = shard.store.keys()
    if len(held) and len(stored):  # a resident copy is fresher than the stored one
        stored = stored[~torch.isin(stored, held)]
    for a in range(0, len(stored), _ROWS_PER_SCAN):
        block = stored[a : a + _ROWS_PER_SCAN]
        parts.append((block, shard.store.lookup(block).rows))
    keys = torch.cat([torch.empty(0, dtype=torch.int64), *(k for k, _ in parts)])
    rows = torch.cat([torch.empty(0, shard.spec.width), *(r for _, r in parts)])
    count, last = row_stats(rows, shard.spec.stats_at)
    return keys, count.clone(), last.clone()


def _resident_rows(
    shard: Shard,
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """The (keys, rows) of the caches' rows on the CPU, device first, and every key resident
    in them (with a row or not)."""
    parts: list[tuple[torch.Tensor, torch.Tensor]] = []
    resident = [torch.empty(0, dtype=torch.int64)]
    for tier in [shard.device_cache, shard.host]:
        if tier is not None and len(tier):
            keys = tier.keys()  # read through slots: a scan must not count as a use
            slots = tier.find_slots(keys)
            resident.append(keys.cpu())
            real = has_row(shard, tier, keys, slots)
            keys, slots = keys[real], slots[real]
            parts.append((keys.cpu(), tier.rows.index_select(0, slots).cpu()))
    return parts, torch.cat(resident)


def remove(shard: Shard, keys: torch.Tensor) -> int:
    """Remove the rows of unique ``keys`` from every tier; returns the rows removed (see
    :meth:`daskhps.table.EmbeddingTable.remove`)."""
    shard.check_writable("remove")
    keys = check_keys(keys, shard.where("remove")).cpu()
    if not len(keys):
        return 0
    gone = _remove_from_device(shard, keys)
    if shard.host is not None:
        found = shard.host.find_slots(keys) >= 0
        if bool(found.any()):
            shard.host.evict(keys=keys[found])
            gone |= found
    in_store = shard.store.contains(keys)
    shard.store.delete(keys[in_store])
    return int((gone | in_store).sum())


def _remove_from_device(shard: Shard, keys: torch.Tensor) -> torch.Tensor:
    """Evict the CPU ``keys`` resident in the device tier; a staged (pinned) one keeps its
    slot, reset to its initial value and clean. Returns which keys were resident."""
    dev, on = shard.device_cache, shard.device
    slots = dev.find_slots(keys.to(on)).cpu()
    on_device = slots >= 0
    if bool(on_device.any()):
        pinned = torch.zeros_like(on_device)
        pinned[on_device] = dev.pinned_at(slots[on_device].to(on)).cpu()
        dev.evict(keys=keys[on_device & ~pinned].to(on))
        staged = keys[pinned]
        if len(staged):
            rows = initial_rows(shard.spec, staged).to(on)
            dev.upsert(staged.to(on), rows, dirty=False)
    return on_device

"""Changing rows in the device tier: a step of the sparse optimizer, and counting the keys
seen (the rows' statistics). Both check their inputs whole before touching a row, so a bad
batch changes nothing, then update the resident rows in one block, dirty after."""

from __future__ import annotations

from collections.abc import Callable

import torch

from daskhps.errors import DataError
from daskhps.table.optimizers import apply_update
from daskhps.table.residency import resident_slots, unique_keys
from daskhps.table.shard import Shard
from daskhps.table.stats import record

__all__ = ["apply_gradients", "record_seen", "update_resident"]


def apply_gradients(shard: Shard, keys: torch.Tensor, grads: torch.Tensor) -> None:
    """Sum the gradients of duplicate keys, then update each row's embedding and optimizer
    state in the device tier; keys frozen by admission take no update."""
    shard.check_writable("apply_gradients")
    keys = shard.device_keys(keys, "apply_gradients")
    grads = _checked_grads(shard, keys, grads)
    ukeys, summed = _summed_grads(shard, keys, grads)
    ukeys, summed = _without_frozen(shard, ukeys, summed)
    dim = shard.spec.dim
    update_resident(
        shard,
        ukeys,
        "apply_gradients",
        lambda b: apply_update(shard.spec.optimizer, b, summed, dim),
    )


def _checked_grads(shard: Shard, keys: torch.Tensor, grads: object) -> torch.Tensor:
    """``grads`` on the shard's device: float32, one row of ``dim`` per key, all finite."""
    where, dim = shard.where("apply_gradients"), shard.spec.dim
    if not isinstance(grads, torch.Tensor) or grads.dtype != torch.float32:
        got = grads.dtype if isinstance(grads, torch.Tensor) else type(grads).__name__
        raise DataError(f"{where}: gradients must be a float32 tensor, got {got}")
    if grads.shape != (keys.shape[0], dim):
        raise DataError(
            f"{where}: gradients must have shape [{keys.shape[0]}, {dim}] "
            f"(one row of dim {dim} per key), got {tuple(grads.shape)}"
        )
    grads = grads.to(shard.device)
    # One reduction (nan and inf propagate through min/max); the scan per row only to
    # name the bad key.
    if grads.numel() and not bool(torch.isfinite(torch.stack(torch.aminmax(grads))).all()):
        bad = int(keys[~torch.isfinite(grads).all(dim=1)][0])
        raise DataError(
            f"{where}: the gradient of key {bad} is not finite (nan or inf); "
            "nothing was applied: lower the learning rate or clip gradients"
        )
    return grads


def _summed_grads(
    shard: Shard, keys: torch.Tensor, grads: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The unique keys and the sum of each one's gradients."""
    ukeys, inv = unique_keys(keys)
    if inv is None:  # 0 + g: the bits index_add_ into zeros gives (-0.0 becomes 0.0)
        return ukeys, grads + 0.0
    summed = torch.zeros(len(ukeys), shard.spec.dim, dtype=torch.float32, device=shard.device)
    summed.index_add_(0, inv, grads)
    return ukeys, summed


def _without_frozen(
    shard: Shard, ukeys: torch.Tensor, summed: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ukeys`` and their gradients less the keys admission froze (they take no update)."""
    if shard.frozen is None:
        return ukeys, summed
    slots = shard.device_cache.find_slots(ukeys)
    keep = (slots < 0) | ~shard.frozen[slots.clamp(min=0)]
    if bool(keep.all()):
        return ukeys, summed
    return ukeys[keep], summed[keep]


def record_seen(
    shard: Shard,
    keys: torch.Tensor,
    counts: torch.Tensor | None = None,
    days: torch.Tensor | int | None = None,
) -> None:
    """Add ``counts`` to the rows' occurrence counts and make ``days`` their last day seen
    (see :meth:`daskhps.table.EmbeddingTable.record_seen`)."""
    shard.check_writable("record_seen")
    keys = shard.device_keys(keys, "record_seen")
    counts = _checked_counts(shard, keys, counts)
    days = _checked_days(shard, keys, days)
    ukeys, inv = unique_keys(keys)
    if inv is not None:  # duplicates: their counts add up, their latest day counts
        counts = torch.zeros(len(ukeys), dtype=torch.int64, device=shard.device).index_add_(
            0, inv, counts
        )
        if isinstance(days, torch.Tensor):
            days = torch.zeros(len(ukeys), dtype=torch.int32, device=shard.device).scatter_reduce_(
                0, inv, days, reduce="amax"
            )
    at = shard.spec.stats_at
    update_resident(shard, ukeys, "record_seen", lambda b: record(b, at, counts, days))


def _checked_counts(shard: Shard, keys: torch.Tensor, counts: torch.Tensor | None) -> torch.Tensor:
    """int64 ``counts`` on the shard's device, one per key, none negative (1 each if None)."""
    where = shard.where("record_seen")
    if counts is None:
        return torch.ones(len(keys), dtype=torch.int64, device=shard.device)
    if (
        not isinstance(counts, torch.Tensor)
        or counts.shape != keys.shape
        or counts.dtype not in (torch.int32, torch.int64)
    ):
        got = (
            f"{counts.dtype} {tuple(counts.shape)}"
            if isinstance(counts, torch.Tensor)
            else type(counts).__name__
        )
        raise DataError(
            f"{where}: counts must be an int32 or int64 tensor of shape {tuple(keys.shape)} "
            f"(one per key), got {got}"
        )
    counts = counts.to(device=shard.device, dtype=torch.int64)
    if len(counts) and int(counts.min()) < 0:
        bad = int(keys[counts < 0][0])
        raise DataError(f"{where}: the count of key {bad} is negative; nothing was counted")
    return counts


def _checked_days(
    shard: Shard, keys: torch.Tensor, days: torch.Tensor | int | None
) -> torch.Tensor | int | None:
    """``days`` as given, a tensor of them checked (one per key) and made int32 on the
    shard's device."""
    if not isinstance(days, torch.Tensor):
        return days
    if days.shape != keys.shape:
        raise DataError(
            f"{shard.where('record_seen')}: days must be one per key, shape "
            f"{tuple(keys.shape)}, or one int; got shape {tuple(days.shape)}"
        )
    return days.to(device=shard.device, dtype=torch.int32)


def update_resident(
    shard: Shard, ukeys: torch.Tensor, what: str, update: Callable[[torch.Tensor], None]
) -> None:
    """Make the rows of unique ``ukeys`` resident, ``update`` their block in place and
    write it back to the device tier, dirty."""
    slots = resident_slots(shard, ukeys, what)
    slab = shard.device_cache.rows
    block = slab.index_select(0, slots)
    update(block)
    slab.index_copy_(0, slots, block)
    shard.device_cache.mark_dirty(slots)

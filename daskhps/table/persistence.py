"""Writing a shard down: dirty rows appended to its store, named commit points, and closing
it (rows changed since the last commit are not kept)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from daskhps.table.shard import Shard
from daskhps.tiers.base import CommitInfo

__all__ = ["FLUSH_ROWS", "close", "commit", "flush"]

log = logging.getLogger("daskhps.table.table")  # the name these records had: filters keep working


# Dirty rows written to the store per step of a flush. Gathering every dirty row of both
# tiers at once (and then concatenating them) copied the tiers' whole contents twice: at each
# checkpoint of a run whose tiers were full of new rows, a worker's memory rose by 400 MB
# over what it held between checkpoints. In steps, a flush holds one step's rows at a time
# (13 MB of dim-64 Adam rows); the store seals its segments by its own buffer's size.
FLUSH_ROWS = 16_384


def flush(shard: Shard) -> int:
    """Append every dirty row of the device and host tiers to the store, ``FLUSH_ROWS`` at a
    time, the device tier's first (as one write of both tiers' rows would order them);
    returns rows written. The rows stay resident, now clean."""
    shard.check_writable("flush")
    written = 0
    for tier in (shard.device_cache, shard.host):
        if tier is None:
            continue
        while True:
            dirty = tier.flush(limit=FLUSH_ROWS).to("cpu")
            if not len(dirty):
                break
            shard.store.upsert(dirty.keys, dirty.rows)
            written += len(dirty)
    shard.store.flush()
    return written


def commit(
    shard: Shard,
    name: str,
    meta: dict[str, Any] | None = None,
    attach: Mapping[str, np.ndarray] | None = None,
) -> CommitInfo:
    """Flush, then record a named commit point in the store."""
    flush(shard)
    return shard.store.commit(name, meta, attach)


def close(shard: Shard, uncommitted: Literal["warn", "drop"]) -> None:
    """Close every tier, saying first how many rows changed since the last commit (a
    warning, or a debug record when the caller drops them on purpose)."""
    if not shard.read_only:
        dirty = _uncommitted_rows(shard)
        if dirty:
            log.log(
                logging.WARNING if uncommitted == "warn" else logging.DEBUG,
                "closing table %r with %d rows changed since its last commit; "
                "call commit() first to keep them",
                shard.spec.name,
                int(dirty),
            )
    shard.device_cache.close()
    if shard.host is not None:
        shard.host.close()
    shard.store.close()


def _uncommitted_rows(shard: Shard) -> int | float:
    dirty = shard.device_cache.stats.extra["dirty_rows"]
    if shard.host is not None:
        dirty += shard.host.stats.extra["dirty_rows"]
    return dirty

"""Disk a run needs: the zarr stores of every shard, their history, and checkpoints.

A store appends each batch of evicted or flushed rows as a new segment and never rewrites one
in place (docs/table.md), so its size is::

    live       rows stored x (4 x width + 8)            one copy of every key's row and key
    history    older copies of rows, until no kept commit and no live row uses their segment:
               at most one copy per row trained per pass (a row is written once per pass that
               changed it); with checkpoints, bounded by the passes the kept commits span
    snapshots  16 bytes per key per full index snapshot kept
    headroom   compaction writes the live rows anew before deleting the old segments

Checkpoints add the dense model's weights and optimizer state per kept checkpoint. With several
tables each table's stores are sized with its own row width and keys, and the run's disk is
their sum (:func:`summed_disk`) plus the checkpoints, counted once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from daskhps._paths import free_bytes

__all__ = [
    "SNAPSHOT_BYTES_PER_KEY",
    "DiskEstimate",
    "checkpoints_dense_bytes",
    "row_disk_bytes",
    "store_disk",
    "summed_disk",
]

SNAPSHOT_BYTES_PER_KEY = 16  # key and location, int64 each


@dataclass(frozen=True)
class DiskEstimate:
    """Bytes on disk for the stores of all workers (``None`` where the keys are unknown)."""

    live: int | None
    history: int | None
    snapshots: int | None
    compaction_headroom: int
    checkpoints_dense: int
    path: str
    free: int | None

    @property
    def total(self) -> int | None:
        """None when the live rows are unknown; an unknown history counts as none (so the
        total is a lower bound then)."""
        if self.live is None:
            return None
        parts = (self.live, self.history or 0, self.snapshots or 0)
        return sum(parts) + self.compaction_headroom + self.checkpoints_dense

    @property
    def stores(self) -> int | None:
        """The stores' part of :attr:`total` (the dense checkpoints go to ``run.dir``)."""
        total = self.total
        return None if total is None else total - self.checkpoints_dense

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


def row_disk_bytes(width: int) -> int:
    """One stored row of ``width`` float32 values and its int64 key."""
    return 4 * width + 8


def _enabled(checkpoint: Any) -> bool:
    return checkpoint is not None and getattr(checkpoint, "every_passes", 0) > 0


def checkpoints_dense_bytes(checkpoint: Any, dense_state_bytes: int) -> int:
    """The dense weights and optimizer state of every kept checkpoint."""
    return checkpoint.keep * dense_state_bytes if _enabled(checkpoint) else 0


def summed_disk(parts: Sequence[DiskEstimate], checkpoints_dense: int) -> DiskEstimate:
    """The stores of every table (``parts``, each sized without checkpoints) and the run's
    dense checkpoints: a figure unknown for any table is unknown for the run."""

    def total(values: Sequence[int | None]) -> int | None:
        return None if None in values else sum(v or 0 for v in values)

    return DiskEstimate(
        live=total([p.live for p in parts]),
        history=total([p.history for p in parts]),
        snapshots=total([p.snapshots for p in parts]),
        compaction_headroom=sum(p.compaction_headroom for p in parts),
        checkpoints_dense=checkpoints_dense,
        path=parts[0].path,
        free=parts[0].free,
    )


def store_disk(
    *,
    width: int,
    distinct_keys: int | None,
    rows_written: int | None,
    pass_rows: int | None,
    checkpoint: Any,
    snapshot_every: int,
    dense_state_bytes: int,
    store_dir: str,
) -> DiskEstimate:
    """Disk of every shard's store under ``store_dir`` and of the checkpoints.

    ``rows_written`` is the most rows the run can write (every pass's working set, summed over
    passes, epochs and owners); ``pass_rows`` the largest one pass writes over all owners;
    ``checkpoint`` the config's checkpoint section, or None where this version has none.
    """
    row = row_disk_bytes(width)
    live = None if distinct_keys is None else distinct_keys * row
    enabled = _enabled(checkpoint)
    history: int | None = None
    if rows_written is not None and distinct_keys is not None:
        stale = max(rows_written - distinct_keys, 0)
        if enabled and pass_rows is not None:
            # Kept commits reference the segments written over the passes they span; a full
            # (compacting) checkpoint every `full_every` frees the older ones.
            span = (
                checkpoint.keep + getattr(checkpoint, "full_every", 1)
            ) * checkpoint.every_passes
            stale = min(stale, span * pass_rows)
        history = stale * row
    snapshots = None
    if distinct_keys is not None:
        kept = 1
        if enabled:
            kept = -(-checkpoint.keep // snapshot_every) + 1
        snapshots = kept * distinct_keys * SNAPSHOT_BYTES_PER_KEY
    headroom = (live or 0) if enabled else 0
    dense = checkpoints_dense_bytes(checkpoint, dense_state_bytes)
    where, free = free_bytes(store_dir)
    return DiskEstimate(live, history, snapshots, headroom, dense, where, free)

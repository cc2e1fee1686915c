"""The memory model of one worker: bytes of every tier and of what training keeps beside them.

Every figure comes from the same arithmetic the tiers use to allocate, so an estimate equals
what the real object reports in ``stats()`` (``bytes``, ``index_bytes``)::

    device / host tier (SlotCache of R rows, width w floats)
      slab        (R + 1) x w x 4        float32 rows, one spare zero row
      metadata    R x 27 (+ 8 with lfu)  key 8, used/dirty/pinned 3, stamp 8, free-stack 8
      index       KeyIndex.nbytes_for(R) buckets of 4 (key, value) pairs at load 0.5
      scratch     96 x min(n, 2**19)     lookup buffers for the largest key batch n
    zarr store (memory)
      index       KeyIndex of the shard's stored keys (grows by doubling)
      write buffer min(65536, keys) x (8 + 4w)   the open segment (resident as rows arrive)
      mapped      min(keys, 65536) x 4w  one chunk file's pages, mapped while its rows are read
    dense model   params x 4 x (weights + grads + optimizer state)
    examples      the pass being read, two passes of routed examples, two holdout chunks
    process       a worker that has trained once: its imports (torch with autograd,
                  pandas, pyarrow, zarr, distributed) and what their allocators keep
    transients    the largest of: a training step and an evaluation step (bytes per example
                  measured on the model, daskhps.capacity.activations), and opening a store
                  that holds rows (its index snapshot read whole)

This module imports neither dask nor the tiers' backends beyond their sizing functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from daskhps.table.persistence import FLUSH_ROWS
from daskhps.tiers.host import rows_for_bytes
from daskhps.tiers.index import MIN_CAPACITY, MIN_SCRATCH, PROBE_CHUNK, KeyIndex
from daskhps.tiers.store.options import StoreOptions

__all__ = [
    "CUDA_BUILD_BYTES",
    "INDEX_SCRATCH_PER_KEY",
    "INSERT_BYTES_PER_KEY",
    "OPEN_BYTES_PER_ROW",
    "WORKER_PROCESS_BYTES",
    "WRITE_BUFFER_ROWS",
    "TierBytes",
    "dense_bytes",
    "index_bytes_holding",
    "index_scratch_bytes",
    "index_transient_bytes",
    "slot_cache_bytes",
    "store_mapped_bytes",
    "store_memory_bytes",
    "summed_tiers",
]

# Reused lookup buffers of KeyIndex._find per key: home, tmp (8 + 8), the gathered bucket row
# (64), the hit mask (4), the column word (4) and the step cache (8).
INDEX_SCRATCH_PER_KEY = 96
WRITE_BUFFER_ROWS = StoreOptions().write_buffer_rows  # what a run's stores buffer
# Optimizer state tensors per dense parameter (torch: Adam keeps exp_avg and exp_avg_sq,
# Adagrad its sum; each also keeps a scalar step, negligible).
DENSE_STATE = {"sgd": 0, "adagrad": 1, "adam": 2}
# A CPU Dask worker's resident memory once it has trained (imports, allocator arenas, Dask's
# own bookkeeping), measured beside the model's parts by scripts/bench_sizing.py: the peak of
# a run less everything else the plan counts. A GPU worker adds its CUDA context.
# The CUDA build of torch maps its CUDA libraries into every process that imports it, with a
# GPU or without one: a warm worker then sits about 375 MiB higher than with the CPU build (880
# against 505 MiB for the same tiny run, measured on one machine with each build).
CUDA_BUILD_BYTES = (375 << 20) if torch.version.cuda else 0
WORKER_PROCESS_BYTES = (560 << 20) + CUDA_BUILD_BYTES
# Opening a store whose commit has an index snapshot reads its keys and row locations whole
# (int64 each) before the index takes them; segments replayed after it are read one at a time.
# Growing an index reads its items out the same way.
OPEN_BYTES_PER_ROW = 16
# Temporaries of KeyIndex._insert per key (the window of buckets each pending key looks at,
# its masks and positions), measured by counting live tensor storage; inserts go in chunks of
# 2**19 keys.
INSERT_BYTES_PER_KEY = 300


@dataclass(frozen=True)
class TierBytes:
    """The memory of one slot-cache tier (device or host) of one table on one worker, or of
    one tier of all its tables (:func:`summed_tiers`; ``width`` None when theirs differ)."""

    rows: int
    width: int | None
    slab: int
    metadata: int
    index: int
    scratch: int

    @property
    def resident(self) -> int:
        """What ``stats()['bytes']`` reports: slab, metadata and index."""
        return self.slab + self.metadata + self.index

    @property
    def total(self) -> int:
        return self.resident + self.scratch


def summed_tiers(parts: Sequence[TierBytes | None]) -> TierBytes | None:
    """One tier of every table of a worker: each table's tier is its own slot cache, so their
    rows and bytes add up (None when no table has the tier)."""
    have = [p for p in parts if p is not None]
    if not have:
        return None
    widths = {p.width for p in have}
    return TierBytes(
        rows=sum(p.rows for p in have),
        width=widths.pop() if len(widths) == 1 else None,
        slab=sum(p.slab for p in have),
        metadata=sum(p.metadata for p in have),
        index=sum(p.index for p in have),
        scratch=sum(p.scratch for p in have),
    )


def index_scratch_bytes(batch_keys: int) -> int:
    """Lookup buffers of one :class:`KeyIndex` after its largest lookup of ``batch_keys``."""
    if batch_keys <= 0:
        return 0
    return INDEX_SCRATCH_PER_KEY * max(min(batch_keys, PROBE_CHUNK), MIN_SCRATCH)


def slot_cache_bytes(
    rows: int, width: int, policy: str = "lru", *, batch_keys: int = 0, load_factor: float = 0.5
) -> TierBytes:
    """Bytes of a device cache (or host tier) of ``rows`` rows of ``width`` floats.

    ``batch_keys`` is the largest key batch looked up at once (a pass's working set when
    staging); it sizes the index's scratch buffers.
    """
    lfu = policy == "lfu"
    slab = 4 * width * (rows + 1)
    meta = rows * (8 + 3 + 8) + 8 * (rows + 1) + (8 * (rows + 1) if lfu else 0)
    return TierBytes(
        rows=rows,
        width=width,
        slab=slab,
        metadata=meta,
        index=KeyIndex.nbytes_for(rows, load_factor),
        scratch=index_scratch_bytes(batch_keys),
    )


def host_tier_bytes(
    capacity_bytes: int, width: int, policy: str = "lru", *, batch_keys: int = 0
) -> TierBytes | None:
    """The host tier a budget of ``capacity_bytes`` makes (None when it holds no row)."""
    rows = rows_for_bytes(width, capacity_bytes, policy)
    if rows < 1:
        return None
    return slot_cache_bytes(rows, width, policy, batch_keys=batch_keys)


def _index_buckets(keys: int, opened: int) -> list[int]:
    """Bucket counts a store's :class:`KeyIndex` goes through: sized for the ``opened`` rows
    of its commit (at least 1024), then doubled whenever an insert would pass the load
    factor, as evictions and flushes write rows a batch at a time, until it holds ``keys``."""
    sizes = [math.ceil(max(MIN_CAPACITY, opened) / (4 * 0.5))]
    while keys > 0.5 * 4 * sizes[-1]:
        sizes.append(2 * sizes[-1])
    return sizes


def _index_table_bytes(buckets: int) -> int:
    return (buckets + 16) * (2 * 4 * 8 + 4)


def index_bytes_holding(keys: int, opened: int = 0) -> int:
    """Bytes of a store's :class:`KeyIndex` opened at ``opened`` rows once it holds ``keys``."""
    return _index_table_bytes(_index_buckets(keys, opened)[-1])


def index_transient_bytes(keys: int, opened: int = 0) -> int:
    """The most a store's index takes beyond its final size, at a moment: opening a commit
    with ``opened`` rows reads its snapshot's keys and locations whole (16 bytes a row) into
    an index already sized for them; a growth reads the old table's items out (16 bytes a
    key) and puts them into the new, twice as large, table, first beside the old table, then
    in chunks whose temporaries are ``INSERT_BYTES_PER_KEY`` a key."""
    sizes = _index_buckets(keys, opened)
    growth = 0
    if len(sizes) > 1:
        old = sizes[-2]
        items = int(0.5 * 4 * old)
        chunk = INSERT_BYTES_PER_KEY * min(items, PROBE_CHUNK)
        growth = OPEN_BYTES_PER_ROW * items + max(_index_table_bytes(old), chunk)
    return max(OPEN_BYTES_PER_ROW * opened, growth)


def store_memory_bytes(keys: int, width: int, *, batch_keys: int = 0, opened: int = 0) -> int:
    """Memory a zarr store of ``keys`` rows holds: its key index (opened at ``opened`` rows),
    scratch and write buffer.

    The write buffer is allocated for 65536 rows but only the rows written into it become
    resident: at most one per key, since a key buffered twice is overwritten in place.
    """
    buffer = min(WRITE_BUFFER_ROWS, keys) * (8 + 4 * width)
    return index_bytes_holding(keys, opened) + index_scratch_bytes(batch_keys) + buffer


def flush_step_bytes(rows: int, width: int) -> int:
    """What a checkpoint's flush holds beyond the store's write buffer (counted with the
    store): one step of dirty rows gathered from a tier
    (:data:`~daskhps.table.persistence.FLUSH_ROWS`, fewer when the upper tiers hold fewer)."""
    return min(FLUSH_ROWS, rows) * (8 + 4 * width)


def store_mapped_bytes(keys: int, width: int, chunk_rows: int = StoreOptions().chunk_rows) -> int:
    """Pages of segment files a store maps while reading rows back: one chunk file at a time
    (each is unmapped once its rows are copied out), at most its live rows. They count in the
    worker's RSS (which Dask's memory limit watches) while mapped."""
    return min(keys, chunk_rows) * 4 * width


def dense_bytes(params: int, optimizer: str) -> int:
    """Weights, gradients and optimizer state of a dense model with ``params`` floats."""
    return 4 * params * (2 + DENSE_STATE[optimizer])

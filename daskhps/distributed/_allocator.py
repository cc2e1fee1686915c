"""How a worker process's C allocator hands out memory: reused, not mapped fresh each time.

Dask's nanny starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536`` (so that freed memory
goes back to the OS). Setting any of glibc's thresholds turns off its adaptive mmap threshold,
so every block over 128 KiB is then a fresh ``mmap`` that is zero-filled page by page when
first written and unmapped when freed. A training step allocates dozens of such tensors (a
batch's rows, activations, gradients, the exchange's buffers): measured on one rank, 12,900
page faults a batch, a third of its time spent in the kernel. Raising both thresholds at
start-up lets the allocator reuse those blocks: under 10 faults a batch.

The cost is memory the process keeps after freeing it: at most ``TRIM_THRESHOLD`` above the
heap's live data, plus the blocks between ``128 KiB`` and ``MMAP_THRESHOLD`` that fragmentation
strands; large tensors (a pass's keys, the tiers) are still mapped and returned whole. So that
Dask's memory monitor does not count that memory against the worker (at 80% of its limit it
pauses the worker, and a run waiting on a paused rank fails: ``distributed.paused``), every
task that ends gives the free memory back (:func:`give_back_free_memory`, ``malloc_trim``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "give_back_free_memory", "reuse_freed_memory"]

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks under it come from the reused heap
TRIM_THRESHOLD = 64 << 20  # free memory kept at the heap's top before it is returned
_M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, loaded once when first needed (``find_library`` runs ``ldconfig``: not
    something every importer should pay)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def reuse_freed_memory() -> bool:
    """Set this process's allocator thresholds; False where the C library is not glibc."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False  # not glibc (musl, macOS): nothing to tune
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    ok = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and ok
    if not ok:
        log.debug("mallopt refused the allocator thresholds; keeping the defaults")
    return ok


def give_back_free_memory() -> None:
    """Return the allocator's free memory to the OS (glibc's ``malloc_trim``); a no-op
    elsewhere."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)

"""What a run really takes: the workers' resident memory sampled while it runs, to set beside
the plan (``daskhps plan``) on a real cluster.

Between :func:`start_sampling` and :func:`stop_sampling` every worker process records its peak
resident set size (RSS): the kernel's high-water mark (``VmHWM``, reset at the start through
``/proc/self/clear_refs``), which sees a transient however short, and a thread sampling RSS
every 10 ms where the kernel offers no reset (then a peak shorter than 10 ms can be missed;
under load the sampler ran late and the growth read 10% low). The growth is the peak minus
the RSS at the start. Start on a worker that has already run once (imports and first
allocations done), so the growth is what the run itself adds, which is what the plan's growth
models; the peak is what its total models.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["measure_growth", "start_sampling", "stop_sampling"]

T = TypeVar("T")

_INTERVAL_S = 0.01
_samples: list[int] = []
_stop = threading.Event()
_peak_reset = False


def _release_free_heap() -> None:
    """Hand the heap's free pages back to the OS before the base is read.

    A worker that has run once keeps what it freed in malloc's arenas; a run then grows into
    those pages without the RSS moving, so the growth measured depended on how much the
    previous run happened to leave there (93 to 107 MiB of a 117 MiB plan, run to run).
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the growth is a lower bound
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def start_sampling() -> int:
    """In a worker: record RSS every 10 ms until :func:`stop_sampling`; returns the RSS now."""
    import psutil

    _release_free_heap()
    proc = psutil.Process()
    _samples.clear()
    _stop.clear()
    _reset_peak()
    base = int(proc.memory_info().rss)

    def sample() -> None:
        while not _stop.is_set():
            _samples.append(int(proc.memory_info().rss))
            time.sleep(_INTERVAL_S)

    threading.Thread(target=sample, daemon=True, name="daskhps-rss").start()
    return base


def stop_sampling() -> int:
    """In a worker: stop sampling; returns the peak RSS seen."""
    _stop.set()
    time.sleep(5 * _INTERVAL_S)  # the sampler's last reading
    return max(max(_samples, default=0), _kernel_peak())


def _reset_peak() -> None:
    """Reset the kernel's RSS high-water mark of this process (Linux 4.0 and later)."""
    global _peak_reset
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _peak_reset = True
    except OSError:
        _peak_reset = False


def _kernel_peak() -> int:
    """The kernel's RSS high-water mark since :func:`_reset_peak`, in bytes; 0 if not reset."""
    if not _peak_reset:
        return 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    return 0


def measure_growth(client: Any, run: Callable[[], T]) -> tuple[T, dict[str, tuple[int, int]]]:
    """``run()``'s result and each worker's RSS in bytes before it and at its peak while it
    ran (the growth is their difference)."""
    base = client.run(start_sampling)
    try:
        result = run()
    finally:
        peak = client.run(stop_sampling)
    return result, {w: (int(base[w]), int(peak[w])) for w in base}

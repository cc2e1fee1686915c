"""What a run really takes: the workers' resident memory sampled while it runs, to set beside
the plan (``daskhps plan``) on a real cluster.

A thread inside every worker process samples its resident set size (RSS) every 10 ms between
:func:`start_sampling` and :func:`stop_sampling`; the growth is the peak minus the RSS at the
start. Start on a worker that has already run once (imports and first allocations done), so
the growth is what the run itself adds, which is what the plan's growth models; the peak is
what its total models.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["measure_growth", "start_sampling", "stop_sampling"]

T = TypeVar("T")

_INTERVAL_S = 0.01
_samples: list[int] = []
_stop = threading.Event()


def start_sampling() -> int:
    """In a worker: record RSS every 10 ms until :func:`stop_sampling`; returns the RSS now."""
    import psutil

    proc = psutil.Process()
    _samples.clear()
    _stop.clear()
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
    return max(_samples, default=0)


def measure_growth(client: Any, run: Callable[[], T]) -> tuple[T, dict[str, tuple[int, int]]]:
    """``run()``'s result and each worker's RSS in bytes before it and at its peak while it
    ran (the growth is their difference)."""
    base = client.run(start_sampling)
    try:
        result = run()
    finally:
        peak = client.run(stop_sampling)
    return result, {w: (int(base[w]), int(peak[w])) for w in base}

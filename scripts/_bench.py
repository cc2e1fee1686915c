"""Shared helpers of the benchmark scripts: timing and the ``--json`` output convention.

Every benchmark prints one result per line. With ``--json`` each line is a JSON object with
``name``, ``value`` and ``unit``, plus ``baseline`` and ``ratio`` (value / baseline) where the
figure is measured against a baseline in the same run: these machines are noisy, so absolute
numbers from different runs are not compared.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any


class Reporter:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.results: list[dict[str, Any]] = []

    def emit(
        self,
        name: str,
        value: float,
        unit: str,
        *,
        baseline: float | None = None,
        baseline_name: str | None = None,
        **extra: Any,
    ) -> None:
        rec: dict[str, Any] = {"name": name, "value": round(value, 4), "unit": unit}
        if baseline is not None:
            rec["baseline"] = round(baseline, 4)
            rec["ratio"] = round(value / baseline, 4) if baseline else None
            if baseline_name:
                rec["baseline_name"] = baseline_name
        rec.update(extra)
        self.results.append(rec)
        if self.as_json:
            print(json.dumps(rec), flush=True)
        else:
            line = f"{name:<48} {value:>14,.1f} {unit}"
            if baseline is not None:
                line += f"   baseline {baseline:,.1f}  ratio {rec['ratio']}"
            if extra:
                line += "   " + " ".join(f"{k}={v}" for k, v in extra.items())
            print(line, flush=True)


def best_time(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> float:
    """Median seconds of ``fn`` over ``repeat`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved(fns: dict[str, Callable[[], object]], repeat: int = 7) -> dict[str, float]:
    """Median seconds of each function, runs interleaved so drift hits all of them alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}

"""Shared helpers of the benchmark scripts: timing and the ``--json`` output convention.

Every benchmark prints one result per line. With ``--json`` each line is a JSON object with
``name``, ``value`` and ``unit``, plus ``baseline`` and ``ratio`` (value / baseline) where the
figure is measured against a baseline in the same run: these machines are noisy, so absolute
numbers from different runs are not compared.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

# Lines of a run's log that say a worker was paused, restarted or killed for memory.
_MEMORY_PROBLEMS = (
    "Pausing worker",
    "Restarting worker",
    "KilledWorker",
    "exceeded 95% memory budget",
    "was killed by unknown signal",
)


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


def interleaved(
    fns: dict[str, Callable[[], object]],
    repeat: int = 7,
    sync: Callable[[], object] | None = None,
) -> dict[str, float]:
    """Median seconds of each function, runs interleaved so drift hits all of them alike.

    ``sync`` ends each timed call: GPU work is asynchronous, so without
    ``torch.cuda.synchronize`` a timer would measure the launch, not the work.
    """
    wait = sync or (lambda: None)
    for fn in fns.values():
        fn()
    wait()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            wait()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def synchronizer(device: str) -> Callable[[], object] | None:
    """What ends a timed call on ``device`` for :func:`interleaved` (None on the CPU)."""
    import torch

    dev = torch.device(device)
    return (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None


def plan(config: Path, *args: str) -> dict[str, Any]:
    """``daskhps plan CONFIG --json``'s report."""
    out = subprocess.run(
        [sys.executable, "-m", "daskhps.cli", "plan", str(config), "--json", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:  # exit 1 with a report: it does not fit, which the report says
        return dict(json.loads(out.stdout))
    except ValueError:
        raise SystemExit(f"daskhps plan failed: {out.stderr[-2000:]}") from None


class Sampler:
    """Peak RSS of every descendant of a process, sampled every 20 ms from a thread."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                children = self.root.children(recursive=True)
            except psutil.Error:  # gone: nothing more to sample
                children = []
            for c in children:
                try:
                    rss = c.memory_info().rss
                except psutil.Error:
                    continue
                self.peaks[c.pid] = max(self.peaks.get(c.pid, 0), rss)
            time.sleep(0.02)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return sorted(self.peaks.values(), reverse=True)


def cli(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m daskhps.cli ARGS`` in its own session, output appended to ``log``."""
    full = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    with open(log, "ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "daskhps.cli", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=full,
            start_new_session=True,
        )


def train(config: Path, log: Path, *args: str, kill_at: str | None = None) -> dict[str, Any]:
    """Run ``daskhps train``; its workers' peak RSS, wall seconds and exit code."""
    env = {"DASKHPS_KILL_AT": kill_at} if kill_at else None
    start = log.stat().st_size if log.exists() else 0
    t0 = time.perf_counter()
    proc = cli("train", str(config), *args, log=log, env=env)
    sampler = Sampler(proc.pid)
    rc = proc.wait()
    peaks = sampler.stop()
    seconds = time.perf_counter() - t0
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    problems = [line for line in text.splitlines() if any(p in line for p in _MEMORY_PROBLEMS)]
    expect = -signal.SIGKILL if kill_at else 0
    if rc != expect:
        raise SystemExit(f"daskhps train exited {rc}, expected {expect}; see {log}")
    return {"rc": rc, "seconds": round(seconds, 1), "peaks": peaks, "memory_problems": problems}

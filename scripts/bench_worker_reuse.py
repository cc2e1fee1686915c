"""Workers that outlive their runs: does each run leave memory behind on them?

    python scripts/bench_worker_reuse.py [--runs 10] [--workers 2] [--rows 20000] [--json]

A real cluster as an operator starts one (a ``dask scheduler`` and ``dask worker`` processes
with their nannies, on 127.0.0.1: tests/_real_cluster.py), and ``daskhps train`` run against
it ``--runs`` times, each a new driver process and a new run folder, as a daily job does.
After each run every worker's resident memory (RSS) is read once Python's collector ran and
malloc gave its free pages back, so what is counted is what the worker still holds.
Reported: each worker's RSS after the last run against its RSS after the first (the first
run's imports and allocator start are in both), the slope of RSS over runs 2..N by least
squares (MiB per run), and whether Dask paused or restarted a worker. The RSS moves by tens
of MiB from run to run with what the allocator keeps; a leak shows as a steady slope.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' real cluster
import yaml
from _bench import Reporter

from daskhps.data.synthetic import GeneratorConfig, generate

MiB = 1 << 20


def worker_rss() -> int:
    """In a worker: its resident bytes once garbage is collected and free heap returned."""
    import psutil

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: a figure a little high
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return int(psutil.Process().memory_info().rss)


def _slope(ys: list[float]) -> float:
    n = len(ys)
    if n < 2:
        return 0.0
    xm, ym = (n - 1) / 2, sum(ys) / n
    num = sum((i - xm) * (y - ym) for i, y in enumerate(ys))
    return num / sum((i - xm) ** 2 for i in range(n))


def memory_problems(folder: Path) -> list[str]:
    """The lines of the workers' logs that say Dask paused or restarted one for memory."""
    words = ("Pausing worker", "Restarting worker", "exceeded 95% memory budget")
    return [
        line.strip()
        for log in folder.glob("worker-*.log")
        for line in log.read_text(errors="replace").splitlines()
        if any(w in line for w in words)
    ]


def _config(tmp: Path, logs: Path, address: str, i: int) -> Path:
    cfg = {
        "run": {"name": f"reuse-{i}", "dir": str(tmp / "runs" / f"run-{i}"), "quiet": True},
        "data": {"train": {"paths": [str(logs)]}, "holdout": {"day": "last"}},
        "passes": {"epochs": 1, "examples_per_pass": 5000, "global_batch_size": 500},
        "table": {"dim": 16, "tiers": {"store_dir": str(tmp / "stores" / f"run-{i}")}},
        "cluster": {"address": address},
    }
    path = tmp / f"run-{i}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def measure(tmp: Path, rep: Reporter, runs: int, workers: int, rows: int, limit: str) -> None:
    logs = tmp / "logs"
    generate(GeneratorConfig(days=2, rows_per_day=rows // 2, parts_per_day=2, seed=3), str(logs))
    from tests._real_cluster import RealCluster

    cluster = RealCluster(tmp / "cluster", workers, memory_limit=limit)
    client = cluster.client()
    try:
        after: list[dict[str, int]] = []
        for i in range(runs):
            config = _config(tmp, logs, cluster.address, i)
            cmd = [sys.executable, "-m", "daskhps.cli", "train", str(config)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise SystemExit(f"run {i} failed ({done.returncode}): {done.stderr[-2000:]}")
            after.append({a: int(v) for a, v in client.run(worker_rss).items()})
            print(f"run {i + 1}/{runs}: RSS MiB {[round(v / MiB, 1) for v in after[-1].values()]}",
                  file=sys.stderr)  # fmt: skip
        problems = memory_problems(tmp / "cluster")
    finally:
        client.close()
        cluster.close()
    for w, address in enumerate(after[0]):
        series = [a[address] / MiB for a in after]
        rep.emit(
            f"worker {w} RSS after run {runs} vs after run 1",
            series[-1],
            "MiB",
            baseline=series[0],
            baseline_name="RSS after run 1 (imports and allocator start included)",
            slope_mib_per_run=round(_slope(series[1:]), 2),
            rss_mib=[round(v, 1) for v in series],
            memory_problems=len(problems),
            loadavg=os.getloadavg()[0],
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=20_000, help="rows of the logs (two days)")
    ap.add_argument("--memory-limit", default="2GiB", help="each worker's --memory-limit")
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    args = ap.parse_args(argv)
    rep = Reporter(args.json)
    with tempfile.TemporaryDirectory() as tmp:
        measure(Path(tmp), rep, args.runs, args.workers, args.rows, args.memory_limit)


if __name__ == "__main__":
    main()

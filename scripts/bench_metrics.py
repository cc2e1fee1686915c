"""Cost of the monitoring hooks on a worker: a stage span, a Workers-table callback, a
snapshot refresh (``EmbeddingTable.stats()``, which walks the store's folder) and a
``/metrics`` collection, on one real shard whose store holds many segments.

    python -m tests.monitor.bench_metrics --rows 1000000 --passes 20

Prints JSON (medians, microseconds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch

from daskhps.distributed import ShardHost, TierSizing
from daskhps.monitor import metric_name, stage_span
from daskhps.monitor.worker_metrics import _collector
from daskhps.table import OptimizerSpec, TableSpec


def _median_us(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000, help="device tier rows")
    ap.add_argument("--passes", type=int, default=20, help="passes (store segments) to write")
    ap.add_argument("--dim", type=int, default=16)
    args = ap.parse_args()
    spec = TableSpec("bench", dim=args.dim, optimizer=OptimizerSpec(kind="adagrad"))
    worker = SimpleNamespace(
        address="tcp://bench:1", memory_manager=SimpleNamespace(memory_limit=None), metrics={}
    )
    with tempfile.TemporaryDirectory() as root:
        host = ShardHost(
            [spec], root, [worker.address], TierSizing(device_rows=args.rows, host_bytes=0)
        )
        host.setup(worker)
        host.open()
        g = torch.Generator().manual_seed(0)
        per_pass = args.rows // 2
        for p in range(args.passes):  # each pass: half the tier new, dirty rows pushed down
            keys = torch.randint(0, 10 * args.rows, (per_pass,), generator=g)
            host.stage("bench", keys)
            host.apply_gradients("bench", keys, torch.full((per_pass, args.dim), 0.01))
            host.unpin("bench")
            host.commit(f"p{p}")
        assert host.monitor is not None
        host.monitor.refresh(force=True)
        figures = host.monitor.figures()["bench"]
        callback = worker.metrics[metric_name("bench", "hit_rate_store")]
        table = host.tables["bench"]

        def span() -> None:
            with stage_span("stage"):
                pass

        out = {
            "rows_device": figures.rows["device"],
            "rows_store": figures.rows["store"],
            "store_bytes": figures.bytes["store"],
            "stage_span_us": _median_us(span, 2000),
            "callback_us": _median_us(lambda: callback(worker), 2000),
            "refresh_us": _median_us(lambda: host.monitor.refresh(force=True), 20),
            "collect_us": _median_us(lambda: list(_collector().collect()), 20),
            # what a refresh is made of
            "device_stats_us": _median_us(lambda: table.device_cache.stats, 20),
            "store_stats_us": _median_us(lambda: table.store.stats, 20),
            "store_files": sum(len(files) for _, _, files in os.walk(root)),
        }
        host.teardown(worker)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""Benchmark the monitoring hooks of a worker against the table's own ``stats()``, same run.

    python scripts/bench_metrics.py [--json] [--quick] [--rows N] [--passes P]

One real shard (a run host's ``WorkerShards`` on a stand-in worker object) trains
``--passes`` passes, each staging half the device tier with new keys, so its zarr store holds
many segments. Then the per-call cost (median, microseconds) of what the monitor does on a worker:

1. a ``stage_span`` (enter and exit);
2. one Workers-table callback (runs at every heartbeat, reads the snapshot);
3. a forced refresh of the snapshot (O(1) sizes, the store's counters and folder walk);
4. one ``/metrics`` collection of the daskhps series;

each against ``EmbeddingTable.stats()`` of the same shard, the call the monitor avoids at
heartbeats (it sums the device tier's masks), timed interleaved with them. The parts of that
call (the device cache's ``TierStats``, the store's ``stats``) are reported beside it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter, interleaved

from daskhps.distributed import RunHost, TierSizing, WorkerShards
from daskhps.monitor import metric_name
from daskhps.monitor.prometheus import collector
from daskhps.stages import stage_span
from daskhps.table import OptimizerSpec, TableSpec

TABLE = "bench"


def _loop(fn: Callable[[], object], n: int) -> Callable[[], None]:
    """``n`` calls of ``fn`` as one timed unit: one call of a microsecond hook is below the
    clock's resolution."""

    def run() -> None:
        for _ in range(n):
            fn()

    return run


def _span() -> None:
    with stage_span("stage"):
        pass


def build_shard(root: Path, rows: int, passes: int, dim: int) -> tuple[RunHost, Any]:
    """A run host with one table trained for ``passes`` passes, and its stand-in worker."""
    spec = TableSpec(TABLE, dim=dim, optimizer=OptimizerSpec(kind="adagrad"))
    worker = SimpleNamespace(
        address="tcp://bench:1", memory_manager=SimpleNamespace(memory_limit=None), metrics={}
    )
    shards = WorkerShards([spec], root, TierSizing(device_rows=rows, host_bytes=0))
    host = RunHost("bench", [worker.address], shards)
    host.setup(worker)
    shards.open()
    gen = torch.Generator().manual_seed(0)
    per_pass = rows // 2
    for p in range(passes):  # each pass: half the tier new, dirty rows pushed down
        keys = torch.randint(0, 10 * rows, (per_pass,), generator=gen)
        shards.stage(TABLE, keys)
        shards.apply_gradients(TABLE, keys, torch.full((per_pass, dim), 0.01))
        shards.unpin(TABLE)
        shards.commit(f"p{p}")
    return host, worker


def bench(rep: Reporter, root: Path, rows: int, passes: int, dim: int, repeat: int) -> None:
    host, worker = build_shard(root, rows, passes, dim)
    try:
        monitor = host.monitor
        assert monitor is not None, "RunHost.setup registers a monitor"
        monitor.refresh(force=True)
        figures = monitor.figures()[TABLE]
        rep.emit("shard: device tier rows", figures.rows["device"], "rows")
        rep.emit("shard: zarr store rows", figures.rows["store"], "rows")
        rep.emit("shard: zarr store size", figures.bytes["store"] / 2**20, "MiB")
        files = sum(len(names) for _, _, names in os.walk(root))
        rep.emit("shard: files under the store", files, "files")

        callback = worker.metrics[metric_name(TABLE, "hit_rate_store")]
        shards = host.require_shards()
        table = shards.tables[TABLE]
        many = 1000
        fns: dict[str, Callable[[], object]] = {
            "span": _loop(_span, many),
            "callback": _loop(lambda: callback(worker), many),
            "refresh": lambda: monitor.refresh(force=True),
            "collect": lambda: list(collector().collect()),
            "table_stats": table.stats,
            "device_stats": lambda: table.device_cache.stats,
            "store_stats": lambda: table.store.stats,
        }
        per = {"span": many, "callback": many}
        t = interleaved(fns, repeat=repeat)
        us = {k: v / per.get(k, 1) * 1e6 for k, v in t.items()}
        base = us["table_stats"]
        base_name = "EmbeddingTable.stats() of the same shard"
        labels = {
            "span": "one stage_span (enter and exit)",
            "callback": "one Workers-table callback",
            "refresh": "forced refresh of the monitor's snapshot",
            "collect": "one /metrics collection of the daskhps series",
        }
        for key, label in labels.items():
            rep.emit(label, us[key], "us", baseline=base, baseline_name=base_name)
        rep.emit("EmbeddingTable.stats(): device cache TierStats", us["device_stats"], "us")
        rep.emit("EmbeddingTable.stats(): store stats (folder walk)", us["store_stats"], "us")
    finally:
        host.teardown(worker)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not figures)")
    p.add_argument("--rows", type=int, help="device tier rows (default 1,000,000)")
    p.add_argument("--passes", type=int, help="passes, each a store segment (default 6)")
    p.add_argument("--dim", type=int, default=16)
    args = p.parse_args(argv)
    rows = args.rows or (20_000 if args.quick else 1_000_000)
    passes = args.passes or (3 if args.quick else 6)
    rep = Reporter(args.json)
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as d:
        bench(rep, Path(d), rows, passes, args.dim, repeat=5 if args.quick else 21)
    rep.emit("threads", torch.get_num_threads(), "torch threads", cpus=os.cpu_count())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark what a recovery onto fewer (or more) workers costs: re-sharding a checkpoint's
stores, against copying the same store files, same run; and re-sharding on the workers
against re-sharding in one process.

    python scripts/bench_reshard.py [--json] [--quick] [--rows N] [--dim 64] [--runs 3]

A recovery that continues on another worker count re-shards the last checkpoint: every row is
read from its old rank store and written to its new owner's (docs/checkpoints.md). A table of
``--rows`` random keys (dim 64 with Adam by default: 780-byte rows, the scale benchmark's) is
built with ``daskhps import`` into 2 rank stores; then, timed:

1. the stores' files copied (``shutil.copytree``): what the disk does at best, the baseline;
2. re-sharding them onto 1 worker and onto 3 (``daskhps.training.resume.reshard``);
3. opening one rank store at the checkpoint's commit: what a recovery onto the same count
   does instead;
4. the 3 rank stores of step 2 re-sharded onto 2 workers (one lost, its store restored onto
   the first survivor) and onto 4, both ways, ``--runs`` times each, interleaved: in this
   process (``resume.reshard``) and on a LocalCluster of that many workers, one thread each
   (``daskhps.distributed.reshard_on_workers``, the rows moving worker to worker through the
   process group's all-to-all). The median rows/s of each, their ratio, the CPU seconds each
   way took (all ranks' processes summed: a figure the machine's other load hardly moves),
   and the bytes that crossed between workers against the least any re-shard sends (each
   row that changes worker, with its key).

Rows per second, and the seconds they give for the scale benchmark's 49.1M-row table
(docs/scale.md), extrapolated linearly: re-sharding streams the rows in blocks, so its time
follows the row count as long as the key index fits in memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter

from daskhps.distributed import ReshardReport, reshard_on_workers, start_cluster
from daskhps.runfiles.checkpoint import Checkpoint, load_checkpoint
from daskhps.training.resume import reshard

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
SCALE_ROWS = 49_100_000  # the scale benchmark's large table (docs/scale.md)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--quick", action="store_true", help="50,000 rows, one run: a smoke run")
    ap.add_argument("--rows", type=int, default=4_000_000, help="rows of the table")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3, help="runs of each step 4 re-shard")
    args = ap.parse_args(argv)
    rows = 50_000 if args.quick else args.rows
    runs = 1 if args.quick else args.runs
    rep = Reporter(args.json)
    with tempfile.TemporaryDirectory(prefix="daskhps-reshard-") as tmp:
        t = Path(tmp)
        rng = np.random.default_rng(0)
        keys = np.unique(rng.integers(0, 2**62, size=int(rows * 1.01), dtype=np.int64))[:rows]
        np.save(t / "keys.npy", rng.permutation(keys))
        np.save(t / "rows.npy", rng.standard_normal((rows, args.dim), dtype=np.float32))
        run = t / "run"
        sets = [
            "--set", f"run.dir={run}",
            "--set", f"data.generate.out={t / 'data'}",
            "--set", f"table.dim={args.dim}",
            "--set", "table.optimizer={kind: adam, lr: 0.001}",
        ]  # fmt: skip
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "daskhps.cli", "import", str(QUICKSTART), *sets,
             "--rows", str(t / "rows.npy"), "--keys", str(t / "keys.npy"), "--workers", "2",
             "--quiet"],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        import_s = time.perf_counter() - t0
        (t / "rows.npy").unlink()
        ckpt = load_checkpoint(run)
        row_bytes = ckpt.table_spec.row_bytes
        rep.emit(
            f"import of {rows:,} rows ({row_bytes} bytes each) into 2 rank stores",
            import_s,
            "s",
            load=round(os.getloadavg()[0], 2),
        )
        t0 = time.perf_counter()
        shutil.copytree(ckpt.stores_dir, t / "copied")
        copy_s = time.perf_counter() - t0
        shutil.rmtree(t / "copied")
        rep.emit("copy of the stores' files (the baseline)", rows / copy_s, "rows/s")
        for workers in (1, 3):
            t0 = time.perf_counter()
            reshard(ckpt, workers, t / f"resharded-{workers}")
            seconds = time.perf_counter() - t0
            if workers != 3:  # the 3 rank stores are step 4's
                shutil.rmtree(t / f"resharded-{workers}")
            rep.emit(
                f"re-shard from 2 workers to {workers}",
                rows / seconds,
                "rows/s",
                baseline=rows / copy_s,
                baseline_name="copying the store files",
                seconds=round(seconds, 2),
                at_scale_s=round(SCALE_ROWS / (rows / seconds)),
            )
        t0 = time.perf_counter()
        with ckpt.open_store(0) as store:
            n = len(store)
        open_s = time.perf_counter() - t0
        rep.emit(
            f"open one rank store ({n:,} rows) at the commit (same worker count)",
            open_s,
            "s",
            at_scale_s=round(open_s * SCALE_ROWS / rows, 1),
        )
        three = dataclasses.replace(ckpt, stores_dir=t / "resharded-3", num_workers=3)
        for workers in (2, 4):
            _on_workers(rep, three, workers, runs, t)
        rep.emit("load average (1 min) at the end", os.getloadavg()[0], "")


def _on_workers(rep: Reporter, ckpt: Checkpoint, workers: int, runs: int, tmp: Path) -> None:
    """``ckpt``'s stores onto ``workers`` workers, ``runs`` times each way, interleaved: in
    this process, and on a LocalCluster of ``workers`` workers (old rank r held by worker
    r mod ``workers``). Beside the seconds, the CPU seconds each way took (this process's;
    every rank's worker process's, summed): what the re-shard costs whatever else runs."""
    one: list[float] = []
    one_cpu: list[float] = []
    reports: list[ReshardReport] = []
    loads: list[float] = []
    with start_cluster(
        n_workers=workers, threads_per_worker=1, memory_limit="auto", dashboard_address=None
    ) as handle:
        addrs = handle.addresses
        holders = {r: addrs[r % workers] for r in range(ckpt.num_workers)}
        for _ in range(runs):
            out = tmp / f"one-{workers}"
            t0, cpu0 = time.perf_counter(), time.process_time()
            reshard(ckpt, workers, out)
            one.append(time.perf_counter() - t0)
            one_cpu.append(time.process_time() - cpu0)
            shutil.rmtree(out)
            out = tmp / f"workers-{workers}"
            reports.append(reshard_on_workers(handle.client, ckpt, holders, addrs, out))
            shutil.rmtree(out)
            loads.append(round(os.getloadavg()[0], 2))
    rows = reports[0].rows
    single = rows / statistics.median(one)
    what = f"re-shard from {ckpt.num_workers} workers to {workers}"
    rep.emit(
        f"{what}, in one process",
        single,
        "rows/s",
        runs_s=[round(s, 2) for s in one],
        cpu_s=round(statistics.median(one_cpu), 2),
    )
    median = statistics.median(r.seconds for r in reports)
    first = reports[0]
    rep.emit(
        f"{what}, on {workers} workers",
        rows / median,
        "rows/s",
        baseline=single,
        baseline_name="re-sharding in one process",
        runs_s=[round(r.seconds, 2) for r in reports],
        ranks_s=[round(max(k.seconds for k in r.ranks), 2) for r in reports],
        cpu_s=round(statistics.median(r.cpu_seconds for r in reports), 2),
        rank_cpu_s=[round(k.cpu_seconds, 2) for k in first.ranks],
        rank_rows_read=[k.rows_read for k in first.ranks],
        moved_mib=round(first.bytes_moved / 2**20, 1),
        min_mib=round(first.min_bytes / 2**20, 1),
        moved_of_min=round(first.bytes_moved / first.min_bytes, 4) if first.min_bytes else None,
        rows_moved=first.rows_moved,
        rounds=first.ranks[0].rounds,
        at_scale_s=round(SCALE_ROWS / (rows / median)),
        load=loads,
    )


if __name__ == "__main__":
    main()

"""Benchmark the click-log pipeline: generate, then read + hash + dedup + shuffle-to-owners.

Figures (rows/s), each against a baseline measured in the same run:

- ``generate``: synthetic Criteo-format rows written per second (no baseline).
- ``read_csv``: plain ``pandas.read_csv`` of the same files, one after another (the baseline).
- ``read_hash``: the daskhps reader (parse, validate, transform, hash), all files.
- ``read_hash_dedup_shuffle``: the above plus local dedup, the shuffle that routes every unique
  key to its owner worker, and the per-owner dedup and sort: one whole pass.

Usage: ``python scripts/bench_pipeline.py [--rows N] [--parts P] [--json]``
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import dask
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter, interleaved

from daskhps.data import read_click_log
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.passes import owner_keys, pass_keys
from daskhps.sharding import ShardMap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000, help="rows to generate and read")
    ap.add_argument("--parts", type=int, default=8, help="files (Dask partitions)")
    ap.add_argument("--workers", type=int, default=2, help="owner workers (shard map)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="Dask threads")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gzip", action="store_true", help="gzip the generated parts")
    ap.add_argument("--out", default=None, help="folder for the generated logs (default: temp)")
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    args = ap.parse_args()
    rep = Reporter(args.json)
    dask.config.set(scheduler="threads", num_workers=args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        cfg = GeneratorConfig(
            rows_per_day=args.rows, parts_per_day=args.parts, seed=0, gzip=args.gzip
        )
        t0 = time.perf_counter()
        summary = generate(cfg, out, num_workers=args.threads)
        gen_s = time.perf_counter() - t0
        rep.emit("generate", args.rows / gen_s, "rows/s", seconds=round(gen_s, 2),
                 ceiling_auc=round(summary.ceiling_auc, 4))  # fmt: skip

        files = sorted(str(p) for p in out.glob("day=*/part-*"))
        lengths = [len(a) for a in np.array_split(np.arange(args.rows), args.parts)]
        shard_map = ShardMap(64, args.workers)
        unique = {}

        def read_csv() -> None:
            for f in files:
                pd.read_csv(f, sep="\t", header=None)

        def read_hash() -> None:
            log = read_click_log(str(out))
            assert int(log.frame.map_partitions(len).sum().compute()) == args.rows

        def full_pass() -> None:
            log = read_click_log(str(out))
            owned = owner_keys(pass_keys(log, lengths, 0, args.rows), shard_map)
            parts = dask.compute(*owned.to_delayed())
            unique["keys"] = sum(len(p) for p in parts)

        times = interleaved(
            {"read_csv": read_csv, "read_hash": read_hash, "full": full_pass},
            repeat=args.repeat,
        )
        base = args.rows / times["read_csv"]
        rep.emit("read_csv", base, "rows/s", seconds=round(times["read_csv"], 2))
        rep.emit("read_hash", args.rows / times["read_hash"], "rows/s", baseline=base,
                 baseline_name="pandas.read_csv", seconds=round(times["read_hash"], 2))  # fmt: skip
        rep.emit(
            "read_hash_dedup_shuffle",
            args.rows / times["full"],
            "rows/s",
            baseline=base,
            baseline_name="pandas.read_csv",
            seconds=round(times["full"], 2),
            unique_keys=unique["keys"],
            workers=args.workers,
        )
        rep.emit("config", args.rows, "rows", parts=args.parts, threads=args.threads,
                 gzip=args.gzip, cpus=os.cpu_count(), machine=platform.machine())  # fmt: skip


if __name__ == "__main__":
    main()

"""Benchmark ``daskhps import``: rows per second from an export's ``.npy`` pair into the rank
stores, against writing the same rows with numpy (the bytes a store must hold, no checks, no
routing, no index).

    python scripts/bench_import.py [--json] [--quick] [--rows N] [--dim D] [--workers W]

One figure (``--json``: a JSON object with name, value, unit, baseline, ratio): rows/s of
:func:`daskhps.importing.import_table` end to end (metadata checks, every chunk's values and
keys checked, routed to the owner ranks, the stores committed with a full index snapshot, the
pass-000000 checkpoint written and moved into place; one-off costs included, such as torch's
first optimizer construction, about 2 s), Adagrad rows (embedding and accumulator: 2 x dim
floats), the input files fresh in the page cache; against ``np.save`` of the full rows the
stores end up holding, plus an fsync.

The machine's load average is printed with each figure: these machines are shared.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter

from daskhps.config import RunConfig
from daskhps.importing import import_table, open_source


def _loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _config(folder: Path, dim: int, workers: int) -> RunConfig:
    return RunConfig.from_dict(
        {
            "run": {"dir": str(folder / "run"), "quiet": True},
            "data": {"train": {"paths": [str(folder / "logs")]}},
            "table": {"dim": dim, "optimizer": {"kind": "adagrad"}},
            "model": {"name": "dlrm", "options": {"bottom_mlp": [16, dim], "top_mlp": [16]}},
            "cluster": {"n_workers": workers},
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="50,000 rows (a smoke run)")
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    args = ap.parse_args()
    n = 50_000 if args.quick else args.rows
    rep = Reporter(args.json)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-import-") as tmp:
        folder = Path(tmp)
        gen = np.random.default_rng(0)
        keys = gen.choice(1 << 62, n, replace=False).astype(np.int64)
        np.save(folder / "keys.npy", keys)
        np.save(folder / "embeddings.npy", gen.standard_normal((n, args.dim), dtype=np.float32))
        del keys
        config = _config(folder, args.dim, args.workers)
        source = open_source(
            config.table_spec(),
            [str(folder / "embeddings.npy")],
            keys=str(folder / "keys.npy"),
        )
        load = _loadavg()
        res = import_table(config, source, progress=False)
        width = config.table_spec().width
        full = np.zeros((n, width), dtype=np.float32)
        full[:, : args.dim] = np.load(folder / "embeddings.npy", mmap_mode="r")
        t0 = time.perf_counter()
        np.save(folder / "baseline.npy", full)
        with open(folder / "baseline.npy", "rb+") as f:
            os.fsync(f.fileno())  # the stores are fsynced at their commit
        base = time.perf_counter() - t0
        rep.emit(
            f"import {n:,} rows x dim {args.dim} (adagrad) into {args.workers} rank stores",
            res.rows_per_second,
            "rows/s",
            baseline=n / base,
            baseline_name="np.save of the same full rows + fsync",
            seconds=round(res.seconds, 2),
            store_bytes=res.bytes,
            loadavg=load,
            loadavg_after=_loadavg(),
        )


if __name__ == "__main__":
    main()

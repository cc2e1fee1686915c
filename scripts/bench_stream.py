"""Benchmark a log larger than the workers' memory: a worker's peak memory against a log four
times shorter, same config, same run.

    python scripts/bench_stream.py [--json] [--rows N | --times-memory X] [--memory-limit 1GiB]
                                   [--workers W] [--out DIR] [--keep]

Generates one day of Criteo-format logs in large plain-text files (read in ``data.block_size``
blocks) and a log of a quarter of its rows, then trains the same config on both with a fraction
holdout evaluated after every pass, on the embedded LocalCluster ``daskhps train`` starts
(``start_cluster``), of ``--workers`` worker processes with ``--memory-limit`` each. A
thread in every worker samples its resident set size (RSS) every 10 ms through each run. The
figure is the long log's peak RSS, less the table's resident bytes (tiers and store index, as
``stats()`` reports them), against the same for the short log (the
baseline); the goal is a ratio of at most 1.1. It also reports the long log's parsed size (8
bytes a key, 4 a dense value and the label, as the parser makes them) against the workers' total
memory limit, and the highest RSS any worker reached as a fraction of its limit (Dask pauses a
worker at 0.8).

``--times-memory X`` sizes the long log's parsed size to X times the workers' total memory
limit (the scale figure uses 4); ``--rows N`` gives the long log's rows directly (the test suite
runs a small one). The logs and runs are removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter

from daskhps.capacity.measured import start_sampling, stop_sampling
from daskhps.config import RunConfig
from daskhps.data.schema import criteo_schema
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.training.trainer import Trainer


def parsed_row_bytes() -> int:
    """Bytes of one parsed Criteo row: a float32 label, float32 dense values, int64 keys."""
    s = criteo_schema()
    return 4 + 4 * len(s.dense_names) + 8 * len(s.categorical_names)


def _logs(out: Path, rows: int, parts: int) -> Path:
    generate(
        GeneratorConfig(rows_per_day=rows, parts_per_day=parts, seed=3, vocab_scale=0.002), out
    )
    return out


def config(
    tmp: Path,
    logs: Path,
    name: str,
    address: str,
    pass_rows: int,
    holdout: float,
    block: str = "4MiB",
) -> RunConfig:
    """Small model and tiers, so the data side is what the worker's memory is made of."""
    return RunConfig.from_dict(
        {
            "run": {"name": name, "dir": str(tmp / name), "seed": 2, "quiet": True},
            "data": {
                "train": {"paths": [str(logs)]},
                "holdout": {"fraction": holdout},
                "block_size": block,
            },
            "passes": {
                "epochs": 1,
                "examples_per_pass": pass_rows,
                "global_batch_size": pass_rows // 10,
            },
            "eval": {"batch_size": pass_rows // 10},
            "table": {
                "dim": 4,
                "optimizer": {"kind": "adagrad", "lr": 0.05},
                "tiers": {"device": {"rows": 20_000}, "host": {"fraction": 0.02}},
            },
            "model": {"name": "dlrm", "options": {"bottom_mlp": [8, 4], "top_mlp": [8]}},
            "dense_optimizer": {"kind": "adam", "lr": 0.01},
            "cluster": {"address": address, "gpu": False},
        },
        source=name,
    )


def _measure(client: Any, cfg: RunConfig) -> dict[str, Any]:
    """Each worker's peak RSS and the table's largest resident bytes on it while ``cfg``
    trains, and the run's examples per second."""
    client.run(start_sampling)
    t0 = time.perf_counter()
    try:
        result = Trainer(cfg, progress=False).run()
    finally:
        peaks = client.run(stop_sampling)
    seconds = time.perf_counter() - t0
    ranks = sorted(peaks)
    table = [max(p["tiers"]["table_bytes"][r] for p in result.passes) for r in range(len(ranks))]
    return {
        "peak": [int(peaks[a]) for a in ranks],
        "table": [int(t) for t in table],
        "examples": sum(p["examples"] for p in result.passes),
        "passes": len(result.passes),
        "seconds": seconds,
        "auc": result.final_eval.get("auc"),
    }


def measure(tmp: Path, rep: Reporter, rows: int, workers: int, limit: int, holdout: float) -> None:
    from dask.utils import format_bytes

    from daskhps.distributed import start_cluster

    parts = max(1, rows // 4_000_000)  # large files, read in blocks
    # Passes of at most 100k rows and blocks of about a third of a pass: a 1 GiB worker holds
    # a pass being read, two routed and the shuffles' buffers well below Dask's pause.
    pass_rows = max(2_500, min(100_000, rows // 16))
    block = "4MiB" if rows < 2_000_000 else "8MiB"
    long = _logs(tmp / "long", rows, parts)
    short = _logs(tmp / "short", rows // 4, max(1, parts // 4))
    warm = _logs(tmp / "warm", max(rows // 16, 10_000), 1)
    # The cluster `daskhps train` starts for a run (its worker settings too), kept for the
    # three runs so both measured ones start from a warmed worker.
    with start_cluster(
        n_workers=workers,
        threads_per_worker=2,
        memory_limit=limit,
        dashboard_address="127.0.0.1:0",
    ) as handle:
        client = handle.client
        address = client.scheduler.address
        # A warmed worker (imports, the process group, the allocator) for both measured runs.
        Trainer(
            config(tmp, warm, "warm-up", address, pass_rows, holdout, block), progress=False
        ).run()
        small = _measure(client, config(tmp, short, "quarter", address, pass_rows, holdout, block))
        big = _measure(client, config(tmp, long, "long", address, pass_rows, holdout, block))
    rest = [p - t for p, t in zip(big["peak"], big["table"], strict=True)]
    rest_small = [p - t for p, t in zip(small["peak"], small["table"], strict=True)]
    parsed = rows * parsed_row_bytes()
    load = os.getloadavg()[0]
    rep.emit(
        "peak worker RSS less table bytes, log 4x longer",
        max(rest) / 2**20,
        "MiB",
        baseline=max(rest_small) / 2**20,
        baseline_name="the same on a log a quarter as long",
        parsed_log=format_bytes(parsed),
        parsed_over_memory=round(parsed / (workers * limit), 2),
        peak_over_limit=round(max(big["peak"] + small["peak"]) / limit, 3),
        rows=rows,
        passes=big["passes"],
        examples_per_s=round(big["examples"] / big["seconds"]),
        seconds=round(big["seconds"] + small["seconds"], 1),
        auc=big["auc"],
        load=round(load, 2),
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--rows", type=int, default=None, help="rows of the long log")
    size.add_argument(
        "--times-memory",
        type=float,
        default=4.0,
        help="the long log's parsed size over the workers' total memory limit (default 4)",
    )
    ap.add_argument("--memory-limit", default="1GiB", help="per worker (default 1GiB)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument(
        "--holdout",
        type=float,
        default=0.25,
        help="holdout fraction (default 0.25: more than a chunk in both logs at small sizes)",
    )
    ap.add_argument("--out", default=None, help="folder for the logs and runs (default: temp)")
    ap.add_argument("--keep", action="store_true", help="keep the logs and runs")
    args = ap.parse_args(argv)
    from dask.utils import parse_bytes

    limit = parse_bytes(args.memory_limit)
    rows = args.rows or int(args.times_memory * args.workers * limit / parsed_row_bytes()) + 1
    rep = Reporter(args.json)
    tmp = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-stream-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        measure(tmp, rep, rows, args.workers, limit, args.holdout)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

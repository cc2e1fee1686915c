"""Benchmark ``daskhps plan``'s memory figures against a real worker's memory, same run.

    python scripts/bench_plan.py [--json] [--out DIR]

One worker process on a LocalCluster (2 GiB limit) trains once on small logs (so imports,
the process group's first setup and the allocators' start are in its baseline), then trains
the measured run while its peak resident memory is recorded (the kernel's high-water mark,
:func:`daskhps.capacity.measured.measure_growth`): 4 times, each on a cluster of its own
whose worker is warmed the same way, in its own run folder, and the largest growth counts.
A reading can only fall short: a second run in the same worker reads 10 to 15 MiB lower,
growing into pages the first freed, and first runs differ by as much with how staging and
training overlap. Two figures, from ``size_run`` with the keys counted by ``--scan``: the
plan's growth (its total less the worker process) against the worker's peak growth, and the
plan's total against the worker's peak RSS, which is what ``daskhps plan`` promises.

The run is shaped so the plan's model is what is compared: dim-64 Adam rows (195 floats),
tiers of tens of MB, more distinct keys than the device tier holds and fewer than device and
host together, so both tiers fill (written, hence resident) and every row is written to the
store at the end without being read back (memory maps of store pages depend on the page
cache, which the plan bounds only from above). The shape is reported beside the figure so a
reader (and ``tests/capacity/test_memory_growth.py``) can check it held.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter

from daskhps.capacity import size_run
from daskhps.capacity.measured import measure_growth
from daskhps.config import RunConfig
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.training.trainer import Trainer

LIMIT = 2 << 30


def _config(
    tmp: Path, logs: Path, address: str, *, warm_up: bool = False, run: int = 0
) -> RunConfig:
    name = f"warm-up-{run}" if warm_up else f"growth-{run}"
    tiers = {"device": {"rows": 30_000}, "host": {"fraction": 0.0132}}
    if warm_up:
        tiers = {"device": {"rows": 8_000}, "host": {"fraction": 0.001}}
    return RunConfig.from_dict(
        {
            "run": {"name": name, "dir": str(tmp / name), "seed": 0, "quiet": True},
            "data": {"train": {"paths": [str(logs)]}},
            "passes": {"epochs": 1, "examples_per_pass": 1000, "global_batch_size": 250},
            "table": {
                "dim": 64,
                "optimizer": {"kind": "adam", "lr": 0.01},  # 193 floats a row
                "tiers": tiers,
            },
            "model": {"name": "dlrm", "options": {"bottom_mlp": [16, 64], "top_mlp": [16]}},
            "dense_optimizer": {"kind": "sgd", "lr": 0.05},
            "cluster": {"address": address, "gpu": False},
        },
        source="bench_plan",
    )


def measure(tmp: Path, rep: Reporter, repeat: int = 4) -> None:
    from distributed import Client, LocalCluster

    logs, small = tmp / "logs", tmp / "small"
    generate(GeneratorConfig(days=1, rows_per_day=18000, parts_per_day=2, seed=5), str(logs))
    generate(GeneratorConfig(days=1, rows_per_day=2000, parts_per_day=2, seed=6), str(small))
    report = size_run(_config(tmp, logs, "tcp://unused"), scan=True, workers=1, memory_limit=LIMIT)
    memory = report.memory
    assert memory is not None and memory.host is not None
    # A reading can only fall short of the run's true growth (a run grows into pages the run
    # before it freed), so each run has a cluster of its own, its worker warmed by the same
    # small run, and the largest of a few counts (their peaks differ with how staging and
    # training overlap).
    runs = []
    for i in range(repeat):
        with (
            LocalCluster(
                n_workers=1,
                threads_per_worker=2,
                memory_limit=LIMIT,
                dashboard_address=None,
                processes=True,
            ) as cluster,
            Client(cluster) as client,
        ):
            address = cluster.scheduler_address
            Trainer(_config(tmp, small, address, warm_up=True, run=i), progress=False).run()
            run_cfg = _config(tmp, logs, address, run=i)
            result, growths = measure_growth(client, Trainer(run_cfg, progress=False).run)
            ((base, peak),) = growths.values()
            runs.append((peak - base, base, peak, result))
    growth, base, peak, result = max(runs, key=lambda r: r[0])
    tiers = result.passes[-1]["tiers"]
    rep.emit(
        "plan's memory growth vs the worker's measured growth",
        memory.growth / 2**20,
        "MiB",
        baseline=growth / 2**20,
        baseline_name="peak RSS growth of a warmed worker during the run",
        plan_tiers_mib=round(memory.tiers / 2**20, 1),
        distinct_keys=report.keys.distinct_keys,
        device_rows=memory.device.rows,
        host_rows=memory.host.rows,
        store_rows_written=tiers["store_rows_written"],
        rows_from_store=tiers["rows_from"]["store"],
        growths_mib=[round(r[0] / 2**20, 1) for r in runs],
    )
    rep.emit(
        "plan's peak per worker vs the worker's measured peak",
        memory.total / 2**20,
        "MiB",
        baseline=peak / 2**20,
        baseline_name="peak RSS of the warmed worker during the run",
        plan_process_mib=round(memory.process / 2**20, 1),
        measured_base_mib=round(base / 2**20, 1),
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--out", default=None, help="folder for the logs and runs (default: temp)")
    ap.add_argument("--repeat", type=int, default=4, help="measured runs; the largest growth")
    args = ap.parse_args(argv)
    rep = Reporter(args.json)
    if args.out is not None:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        measure(Path(args.out), rep, args.repeat)
        return
    with tempfile.TemporaryDirectory() as tmp:
        measure(Path(tmp), rep, args.repeat)


if __name__ == "__main__":
    main()

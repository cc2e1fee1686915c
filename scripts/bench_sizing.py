"""Benchmark ``daskhps plan``'s peak memory per worker against the peak of the real run.

    python scripts/bench_sizing.py [--json] [--out DIR] [--cases quickstart,day]
                                   [--day-rows 2000000] [--config FILE ...] [--keep]

Each case is a config run the way a user runs it: ``daskhps plan CONFIG --scan --json`` says
what one worker holds at its peak, then ``daskhps train CONFIG`` runs on its embedded
LocalCluster while a thread samples the resident set size (RSS) of every worker process every
20 ms. The figure is each case's highest worker peak against the plan's total (the goal: within
20%), with the plan's parts beside it and the process size the run implies (the peak less
everything else the plan counts), which is what ``WORKER_PROCESS_BYTES`` stands for.

The cases::

    quickstart  configs/quickstart.yaml as shipped (2 workers of 3 GiB, 200k training rows)
    day         a day of --day-rows generated Criteo rows at full vocabularies (about 1.35M
                keys at 2M rows), dim 32 with Adagrad, 2 workers of 3 GiB, passes of 500k
                rows, evaluated on the next day
    --config    any other config file (its run.dir and generated data go under --out)

Everything written goes under --out (a temporary folder by default) and is removed at the end
unless ``--keep``.
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

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter, plan, train

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def _write(config: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def quickstart(out: Path, day_rows: int) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    return _place(cfg, out, "quickstart")


def day(out: Path, day_rows: int) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    cfg["run"]["name"] = "day"
    cfg["data"]["generate"].update(rows_per_day=day_rows, parts_per_day=8, vocab_scale=1.0, seed=3)
    cfg["passes"].update(epochs=1, examples_per_pass=max(day_rows // 4, 1000))
    cfg["table"]["dim"] = 32
    cfg["table"]["optimizer"] = {"kind": "adagrad", "lr": 0.05}
    return _place(cfg, out, "day")


def _place(cfg: dict[str, Any], out: Path, name: str) -> Path:
    """``cfg`` with its run folder and generated logs under ``out``."""
    cfg.setdefault("run", {})["dir"] = str(out / "runs" / name)
    gen = cfg.get("data", {}).get("generate")
    if gen is not None:
        gen["out"] = str(out / "data" / name)
    return _write(cfg, out / f"{name}.yaml")


CASES = {"quickstart": quickstart, "day": day}


def measure(config: Path, out: Path, rep: Reporter, name: str) -> None:
    from dask.utils import format_bytes

    log = out / f"{name}.log"
    t0 = time.perf_counter()
    report = plan(config, "--scan")
    memory = report["memory_per_worker"]
    shutil.rmtree(out / "runs" / name, ignore_errors=True)
    run = train(config, log)
    peaks = run["peaks"]
    workers = report["workers"]
    measured = max(peaks[:workers])
    predicted = memory["total"]
    rep.emit(
        f"{name}: worker peak RSS, measured vs plan",
        measured / MIB,
        "MiB",
        baseline=predicted / MIB,
        baseline_name="daskhps plan --scan: memory per worker at its peak",
        worker_peaks_mib=[round(p / MIB) for p in peaks[:workers]],
        plan_parts_mib={
            k: round(memory[k] / MIB, 1)
            for k in ("process", "tiers", "dense", "examples", "transient")
        },
        # The peak less every part but the process: what the process itself came to.
        implied_process_mib=round((measured - (predicted - memory["process"])) / MIB, 1),
        memory_problems=run["memory_problems"],
        limit=format_bytes(memory["memory_limit"]),
        seconds=round(time.perf_counter() - t0, 1),
        load=round(os.getloadavg()[0], 2),
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--out", default=None, help="working folder (default: a temporary one)")
    ap.add_argument(
        "--cases", default="quickstart,day", help=f"comma-separated, of {', '.join(CASES)}"
    )
    ap.add_argument("--day-rows", type=int, default=2_000_000, help="rows of the day case")
    ap.add_argument("--config", action="append", default=[], help="another config to measure")
    ap.add_argument("--keep", action="store_true", help="keep the runs and logs written")
    args = ap.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            ap.error(f"--cases: unknown case {c!r}; choose from {', '.join(CASES)}")
    rep = Reporter(args.json)
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-sizing-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        for c in cases:
            measure(CASES[c](out, args.day_rows), out, rep, c)
        for path in args.config:
            name = Path(path).stem
            cfg = yaml.safe_load(Path(path).read_text())
            measure(_place(cfg, out, name), out, rep, name)
    finally:
        if not args.keep:
            for sub in ("runs", "data"):
                shutil.rmtree(out / sub, ignore_errors=True)
            if args.out is None:
                shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()

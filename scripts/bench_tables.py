"""Several embedding tables against one: each field at a dim set by its vocabulary size against
one dim for every field, ``daskhps train`` end to end on the same day of logs.

    python scripts/bench_tables.py [--json] [--quick] [--rows 2000000] [--rounds 3]
                                   [--variants one-16,one-64,per-field,per-field-rowwise]
                                   [--out DIR] [--results FILE] [--tiers 0.07]

The logs: the scale benchmarks' day (``scripts/bench_sizing.py``'s ``day`` case): two days of
``--rows`` generated Criteo-format rows at full vocabularies (``vocab_scale`` 1.0, seed 3, 8
parts a day); the first day trains in passes of a quarter of it, the second is the holdout.
``--out DIR`` keeps them in ``DIR/rows-ROWS`` and reuses them while they are complete and
generated with these settings; without it everything goes to a temporary folder.

The variants, each DLRM (its default widths; fields narrower than the widest are projected
to it, daskhps.models.dlrm) with Adagrad (lr 0.05) on the embeddings and Adam on the dense
layers, batches of 4,096, one epoch, on the embedded LocalCluster of 2 workers (2 threads,
3 GiB each, device and host tiers of ``--tiers`` of it, 0.07 as ``configs/quickstart.yaml``)::

    one-16             one table, dim 16 for every field (the quickstart's)
    one-64             one table, dim 64 for every field: the widest per-field dim, what one
                       table must give every field for its largest ones to get theirs
                       (``configs/criteo.yaml``'s); the baseline of the ratios
    per-field          each field at dim_for(its vocabulary) (below), the fields of one dim in
                       one table (``tables:``), those of dim 64 in the default table
    per-field-rowwise  the same tables, each with its own optimizer: the tables of dim 32 and
                       64 (the fields with the most rows) row-wise Adagrad (one accumulator a
                       row instead of one a float), the others per-element Adagrad

``dim_for(vocab)`` = ``2 * vocab ** 0.25`` rounded to the nearest power of two (in log2),
clamped to [4, 64]: 4 for a field of tens of values, 16 for thousands, 64 for hundreds of
thousands and more. The vocabularies are the generator's (``daskhps.data.synthetic.VOCAB``:
Criteo Kaggle's, capped at 1M); ``configs/criteo_tables.yaml`` applies the same rule to the
uncapped Kaggle counts (:data:`CRITEO_KAGGLE_VOCAB`).

Each variant's figures:

* table bytes: every table's rows over the ranks (the final checkpoint's commit records)
  times its row's bytes (embedding, optimizer state and row statistics: the layout's width
  x 4); the embeddings' part (rows x dim x 4: what an export or a server holds) beside it;
* store bytes on disk: the blocks the run's stores folder takes (what ``du`` counts), the
  checkpoints' deltas included;
* training examples/s: the passes' examples over their ``seconds.train`` (``metrics.jsonl``);
* holdout AUC: ``summary.json``'s ``final_eval`` (the whole second day);
* exchange bytes per example: the rows and gradients the ranks sent each other (the passes'
  ``network`` records, ``rows.sent + grads.sent``) over the examples trained.

The JSON file also holds each variant's staged rows by the tier they came from
(``staged_from``) and the busiest rank's seconds per step stage (``worker_seconds``), summed
over the passes: a fractional tier budget is split between the tables so that each gets about
the same number of rows (``daskhps.tier_sizing``), so tables of very different sizes read more
from their stores than one table in the same memory does.

Runs are fresh processes, interleaved (every variant, then again ``--rounds`` times); every
figure is the median over the rounds, with the 1-minute load average before each run (the
median and the range). Ratios are each variant over ``one-64`` of the same rounds. With
``--json`` every figure is one JSON object per line (``scripts/_bench.py``'s convention);
without it a Markdown table follows. The figures go to ``--results`` (default
``OUT/bench_tables.json``, or ``bench_tables.json`` in the working folder without ``--out``).
``--quick``: 10,000 rows a day in one pass, one round: a smoke run, not figures.

Every variant's config is loaded (``daskhps config``'s checks) before the first run, so a
variant that would fail does so before any trains.

Measured: docs/table.md#measured-several-tables.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter

TRAIN_DAY = "2024-01-01"
BASELINE = "one-64"
VARIANTS = ("one-16", "one-64", "per-field", "per-field-rowwise")
MIN_DIM, MAX_DIM = 4, 64
TIERS = 0.07  # device and host tier fractions of the worker's memory (the quickstart's)
ROWWISE_FROM = 32  # tables of this dim and wider take row-wise Adagrad in per-field-rowwise

# Distinct values of each categorical field, C1..C26, in Criteo's Kaggle display-advertising
# challenge data (train.txt, 7 days, 45.8M rows), as counted by the DLRM and TorchRec Kaggle
# preprocessing (their embedding table sizes).
CRITEO_KAGGLE_VOCAB = (
    1460, 583, 10_131_227, 2_202_608, 305, 24, 12517, 633, 3, 93145, 5683, 8_351_593, 3194,
    27, 14992, 5_461_306, 10, 5652, 2173, 4, 7_046_547, 18, 15, 286_181, 105, 142_572,
)  # fmt: skip


def dim_for(vocab: int) -> int:
    """A field's embedding dim by its vocabulary size: ``2 * vocab ** 0.25`` rounded to the
    nearest power of two in log2, clamped to [4, 64]. The fourth root is the usual rule of
    thumb (dims grow far slower than vocabularies); the power of two groups fields into few
    tables; 2x puts fields of tens of values at 4 and of hundreds of thousands at 64."""
    raw = 2.0 * max(int(vocab), 1) ** 0.25
    return int(min(MAX_DIM, max(MIN_DIM, 2 ** round(math.log2(raw)))))


def field_dims(vocab: Sequence[int]) -> dict[str, int]:
    """``{C1: dim, ...}`` of the categorical fields of these vocabularies, by :func:`dim_for`."""
    return {f"C{i + 1}": dim_for(v) for i, v in enumerate(vocab)}


def tables_section(
    dims: dict[str, int], default_dim: int, optimizers: dict[int, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """A ``tables:`` section holding each dim's fields in one table named ``dim<D>``, but those
    of ``default_dim`` (they stay in the default table); ``optimizers[D]`` is table D's."""
    out = []
    for dim in sorted(set(dims.values())):
        if dim == default_dim:
            continue
        entry: dict[str, Any] = {
            "name": f"dim{dim}",
            "dim": dim,
            "features": [f for f, d in dims.items() if d == dim],
        }
        if optimizers and dim in optimizers:
            entry["optimizer"] = optimizers[dim]
        out.append(entry)
    return out


# -- configs -----------------------------------------------------------------------------------


def base_config(data: Path, run_dir: Path, pass_rows: int, tiers: float) -> dict[str, Any]:
    return {
        "run": {"name": run_dir.name, "seed": 0, "dir": str(run_dir), "quiet": True},
        "data": {"train": {"paths": [str(data)]}, "holdout": {"day": "last"}},
        "passes": {
            "epochs": 1,
            "examples_per_pass": pass_rows,
            "global_batch_size": min(4096, pass_rows // 4),
        },
        "table": {
            "dim": 16,
            "optimizer": {"kind": "adagrad", "lr": 0.05},
            "tiers": {"device": {"fraction": tiers}, "host": {"fraction": tiers}},
        },
        "model": {"name": "dlrm"},
        "dense_optimizer": {"kind": "adam", "lr": 1.0e-3},
        "cluster": {
            "n_workers": 2,
            "threads_per_worker": 2,
            "memory_limit": "3GiB",
            "gpu": False,
            "dashboard_address": "127.0.0.1:0",
        },
        "eval": {"every_pass": False},
    }


def variant_config(
    name: str, data: Path, run_dir: Path, pass_rows: int, tiers: float = TIERS
) -> dict[str, Any]:
    from daskhps.data.synthetic import GeneratorConfig

    cfg = base_config(data, run_dir, pass_rows, tiers)
    table = cfg["table"]
    if name.startswith("one-"):
        table["dim"] = int(name.removeprefix("one-"))
        return cfg
    dims = field_dims(GeneratorConfig(vocab_scale=1.0).vocab().tolist())
    widest = max(dims.values())
    table["dim"] = widest
    optimizers = None
    if name == "per-field-rowwise":
        per_element = {**table["optimizer"], "row_wise": False}
        row_wise = {**table["optimizer"], "row_wise": True}
        table["optimizer"] = row_wise  # the default table: the widest fields
        optimizers = {d: row_wise if d >= ROWWISE_FROM else per_element for d in dims.values()}
    cfg["tables"] = tables_section(dims, widest, optimizers)
    return cfg


def check_configs(
    out: Path, data: Path, variants: Sequence[str], pass_rows: int, tiers: float
) -> None:
    """Load every variant's config as ``daskhps train`` would, before any run."""
    from daskhps.config import RunConfig

    for v in variants:
        d = variant_config(v, data, out / "runs" / v, pass_rows, tiers)
        RunConfig.from_dict(d, source=v)


# -- data and runs -----------------------------------------------------------------------------


def logs(out: Path, rows: int, parts: int) -> Path:
    """The two days of logs in ``out``, generated unless already there with these settings."""
    from daskhps.config.data import GenerateConfig

    gen = GenerateConfig(
        out=str(out), days=2, rows_per_day=rows, parts_per_day=parts, vocab_scale=1.0, seed=3
    )
    t = time.perf_counter()
    if gen.ensure():
        progress(f"generated {2 * rows:,} rows in {time.perf_counter() - t:.1f} s")
    return out


def progress(line: str) -> None:
    """Progress, on stderr (stdout holds the figures)."""
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def disk_bytes(folder: Path) -> int:
    """The bytes ``du`` counts for ``folder``: every file's allocated blocks."""
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            st = os.lstat(os.path.join(root, f))
            total += st.st_blocks * 512
    return total


def table_figures(run_dir: Path) -> dict[str, Any]:
    """Rows, row bytes and embedding bytes of every table at the run's final checkpoint."""
    from daskhps.runfiles.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise SystemExit(f"{run_dir}: no checkpoint; the run should end with one")
    m = ckpt.manifest
    layouts = m.get("tables") or [m["table"]]
    several = bool(m.get("tables"))
    out: dict[str, Any] = {"tables": {}, "table_bytes": 0, "embedding_bytes": 0, "rows": 0}
    for layout in layouts:
        name = layout["table"]
        rows = sum(int((s["tables"][name] if several else s)["commit_rows"]) for s in m["shards"])
        row_bytes = int(layout["width"]) * 4  # float32 rows (daskhps.table.spec)
        out["tables"][name] = {"dim": layout["dim"], "rows": rows, "row_bytes": row_bytes}
        out["table_bytes"] += rows * row_bytes
        out["embedding_bytes"] += rows * int(layout["dim"]) * 4
        out["rows"] += rows
    return out


def run_variant(
    name: str, data: Path, out: Path, pass_rows: int, tiers: float = TIERS
) -> dict[str, Any]:
    run_dir = out / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    config = out / f"{name}.yaml"
    config.write_text(
        yaml.safe_dump(variant_config(name, data, run_dir, pass_rows, tiers), sort_keys=False)
    )
    log = out / f"{name}.log"
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        rc = subprocess.run(
            [sys.executable, "-m", "daskhps.cli", "train", str(config)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            check=False,
        ).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"daskhps train {config} exited {rc}:\n{tail}")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    passes = [p for p in (json.loads(x) for x in lines if x.strip()) if "examples" in p]
    examples = sum(int(p["examples"]) for p in passes)
    train_s = sum(float(p["seconds"]["train"]) for p in passes)
    exchanged = sum(
        int(p["network"]["rows"]["sent"]) + int(p["network"]["grads"]["sent"]) for p in passes
    )
    least = sum(
        int(p["network"]["rows"]["min"]) + int(p["network"]["grads"]["min"]) for p in passes
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    staged: dict[str, int] = {}
    stages: dict[str, float] = {}
    for p in passes:
        for k, v in p.get("staged_from", {}).items():
            staged[k] = staged.get(k, 0) + int(v)
        for k, v in p.get("worker_seconds", {}).items():
            stages[k] = stages.get(k, 0.0) + float(v)
    result = {
        "load": load,
        "wall_s": wall,
        "passes": len(passes),
        "examples": examples,
        "examples_per_s": examples / train_s,
        "auc": float(summary["final_eval"]["auc"]),
        "logloss": float(summary["final_eval"]["logloss"]),
        "exchange_bytes_per_example": exchanged / examples,
        "exchange_least_per_example": least / examples,
        "store_disk_bytes": disk_bytes(run_dir / "stores"),
        "staged_from": staged,
        "worker_seconds": stages,
        **table_figures(run_dir),
    }
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


# -- report ------------------------------------------------------------------------------------

# (key, name in the report, unit)
FIGURES = (
    ("table_bytes", "table bytes (rows x row bytes)", "B"),
    ("embedding_bytes", "embedding bytes (rows x dim x 4)", "B"),
    ("store_disk_bytes", "store bytes on disk", "B"),
    ("examples_per_s", "training examples/s", "examples/s"),
    ("auc", "holdout AUC", "AUC"),
    ("exchange_bytes_per_example", "exchange bytes per example (rows + grads)", "B"),
)


def median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(float(r[key]) for r in runs))


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each variant's medians, load averages and tables, and its ratios over the baseline's."""
    out: dict[str, Any] = {}
    base = runs.get(BASELINE)
    for v, rs in runs.items():
        loads = [r["load"] for r in rs]
        med = {k: median(rs, k) for k, _, _ in FIGURES}
        out[v] = {
            **med,
            "rows": median(rs, "rows"),
            "tables": rs[-1]["tables"],
            "auc_runs": [round(r["auc"], 5) for r in rs],
            "examples_per_s_runs": [round(r["examples_per_s"]) for r in rs],
            "wall_s": median(rs, "wall_s"),
            "exchange_least_per_example": median(rs, "exchange_least_per_example"),
            "staged_from": rs[-1]["staged_from"],
            "worker_seconds": {
                k: statistics.median(r["worker_seconds"].get(k, 0.0) for r in rs)
                for k in rs[-1]["worker_seconds"]
            },
            "load": {"median": statistics.median(loads), "min": min(loads), "max": max(loads)},
        }
        if base:
            out[v]["ratio_to_" + BASELINE] = {
                k: (med[k] / median(base, k) if median(base, k) else None) for k, _, _ in FIGURES
            }
    return out


def report(rep: Reporter, summary: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> None:
    base = summary.get(BASELINE)
    for v, s in summary.items():
        for key, title, unit in FIGURES:
            extra: dict[str, Any] = {
                "variant": v,
                "load": round(s["load"]["median"], 2),
                "load_range": [round(s["load"]["min"], 2), round(s["load"]["max"], 2)],
                "rounds": len(runs[v]),
            }
            if key == "table_bytes":
                extra["rows"] = int(s["rows"])
                extra["tables"] = {t: x["dim"] for t, x in s["tables"].items()}
            rep.emit(
                f"{title}, {v}",
                s[key],
                unit,
                baseline=base[key] if base else None,
                baseline_name=BASELINE if base else None,
                **extra,
            )


def markdown(summary: dict[str, Any]) -> str:
    cols = [
        ("table MiB", "table_bytes", 2**20),
        ("embeddings MiB", "embedding_bytes", 2**20),
        ("store on disk MiB", "store_disk_bytes", 2**20),
        ("examples/s", "examples_per_s", 1),
        ("holdout AUC", "auc", 1),
        ("exchange B/example", "exchange_bytes_per_example", 1),
    ]
    head = "| variant | tables (dim: fields) | " + " | ".join(c for c, _, _ in cols) + " | load |"
    lines = [head, "| --- | --- |" + " ---: |" * (len(cols) + 1)]
    for v, s in summary.items():
        ratio = s.get("ratio_to_" + BASELINE, {})
        cells = []
        for _, key, scale in cols:
            val = s[key] / scale
            text = f"{val:.4f}" if key == "auc" else f"{val:,.0f}" if val >= 100 else f"{val:.1f}"
            if key != "auc" and ratio.get(key) is not None and v != BASELINE:
                text += f" ({ratio[key]:.2f}x)"
            cells.append(text)
        tables = ", ".join(f"{x['dim']}: {x['rows']:,} rows" for x in s["tables"].values())
        load = f"{s['load']['median']:.1f} ({s['load']['min']:.1f}-{s['load']['max']:.1f})"
        lines.append(f"| {v} | {tables} | " + " | ".join(cells) + f" | {load} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per figure")
    ap.add_argument("--quick", action="store_true", help="10,000 rows a day, one round")
    ap.add_argument("--rows", type=int, default=None, help="rows a day (2,000,000)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of every variant (3)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, in order")
    ap.add_argument("--out", default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--results", default=None, help="where the figures go (JSON)")
    ap.add_argument(
        "--tiers", type=float, default=TIERS, help=f"device and host tier fractions ({TIERS})"
    )
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    rows = args.rows or (10_000 if args.quick else 2_000_000)
    rounds = args.rounds or (1 if args.quick else 3)
    pass_rows = rows if args.quick else max(1_000, rows // 4)
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-tables-"))
    out.mkdir(parents=True, exist_ok=True)
    results = Path(args.results) if args.results else out / "bench_tables.json"
    if not args.results and not args.out:
        results = Path("bench_tables.json")
    try:
        data = logs(out / f"rows-{rows}", rows, 2 if args.quick else 8)
        check_configs(out, data, variants, pass_rows, args.tiers)
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for r in range(rounds):
            for v in variants:
                progress(f"round {r + 1}/{rounds}: {v} ...")
                got = run_variant(v, data, out, pass_rows, args.tiers)
                runs[v].append(got)
                progress(
                    f"  {got['examples_per_s']:,.0f} examples/s, auc {got['auc']:.4f}, "
                    f"{got['table_bytes'] / 2**20:,.1f} MiB of rows, load {got['load']:.2f}"
                )
        summary = summarise(runs)
        results.write_text(
            json.dumps(
                {
                    "rows_per_day": rows,
                    "train_day": TRAIN_DAY,
                    "pass_rows": pass_rows,
                    "tiers": args.tiers,
                    "rounds": rounds,
                    "baseline": BASELINE,
                    "variants": summary,
                    "runs": runs,
                },
                indent=2,
            )
        )
        rep = Reporter(args.json)
        report(rep, summary, runs)
        if not args.json:
            print()
            print(markdown(summary))
    finally:
        shutil.rmtree(out / "runs", ignore_errors=True)
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()

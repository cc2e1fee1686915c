"""Feature lifecycle on drifting logs: daily retraining with admission and expiry against the
same retraining without them, day by day.

    python scripts/bench_lifecycle.py [--json] [--days 14] [--rows-per-day 40000]
        [--drift 0.1] [--one-off 0.3] [--min-count 2] [--ttl-days 3] [--keep-versions 2]
        [--out DIR]

Generates ``days + 1`` days of drifting synthetic logs once (``daskhps generate --drift RATE
--one-off SHARE``: each day a share of every slot's popular keys is replaced by new ones, and a
share of the values are keys that occur once), then runs ``daskhps retrain`` once per new day
for two configurations on the same logs, each in its own run folder:

- ``unbounded``: every key gets a row and keeps it;
- ``bounded``: ``table.admission.min_count``, ``table.expiry.ttl_days`` and
  ``retrain.keep_versions``.

Every retraining run trains on the newest day from the published version and scores the
candidate on the day after (progressive validation); the guard is opened wide
(``retrain.max_auc_drop: 1``) so each day publishes and both runs train the same days. After
each day it records, per configuration: the scored day's AUC and logloss, the table's rows
(its published version's stores), the keys waiting for admission, the stores' bytes on disk,
and what counting costs: the seconds of the ``admit``, ``count`` and ``expire`` stages against
the pass's seconds (route, staging, those, training and the unpin), from ``metrics.jsonl``.

Figures (goals from the issue): the bounded run's last-day AUC minus the unbounded one's
(goal >= -0.002), its last-day rows over the unbounded one's (goal <= 0.5), the counting
stages' share of the pass time (goal <= 0.1). ``OUT/lifecycle.json`` holds every day's
figures, ``OUT/lifecycle.svg`` plots rows, disk and AUC per day for both runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter

from daskhps._paths import tree_bytes
from daskhps.retrain.versions import Registry
from daskhps.runfiles.checkpoint import load_checkpoint
from daskhps.training.inspection import describe_checkpoint

ROOT = Path(__file__).resolve().parents[1]
GOAL_AUC_GAP, GOAL_ROWS, GOAL_COUNTING = -0.002, 0.5, 0.1
COUNTING = ("admit", "count", "expire")
PASS_PARTS = ("route", "stage_ahead", "stage", "admit", "train", "count", "expire", "unpin_repin")


def _settings(args: argparse.Namespace, out: Path, name: str) -> list[str]:
    common = {
        "run.name": name,
        "run.dir": str(out / name),
        "run.quiet": "true",
        "data.generate.out": str(out / "logs"),
        "data.generate.rows_per_day": str(args.rows_per_day),
        "data.generate.parts_per_day": "2",
        "data.generate.vocab_scale": str(args.vocab_scale),
        "data.generate.drift": str(args.drift),
        "data.generate.one_off": str(args.one_off),
        "passes.examples_per_pass": str(args.rows_per_day // 2),
        "passes.global_batch_size": str(min(4096, args.rows_per_day // 8)),
        "table.tiers.device.fraction": "0.1",
        "table.tiers.host.fraction": "0.1",
        "cluster.n_workers": str(args.workers),
        "cluster.memory_limit": "3GiB",
        "retrain.max_auc_drop": "1.0",
        "retrain.max_logloss_rise": "1.0",
    }
    if name == "bounded":
        common["table.admission.min_count"] = str(args.min_count)
        common["table.expiry.ttl_days"] = str(args.ttl_days)
        common["retrain.keep_versions"] = str(args.keep_versions)
    return [f"--set={k}={v}" for k, v in common.items()]


def _retrain(args: argparse.Namespace, out: Path, name: str, days: int) -> float:
    cmd = [
        sys.executable,
        "-m",
        "daskhps.cli",
        "retrain",
        str(ROOT / "configs" / "retrain.yaml"),
        *_settings(args, out, name),
        f"--set=data.generate.days={days}",
    ]
    t = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=out, env=dict(os.environ))
    if run.returncode != 0:
        raise SystemExit(
            f"{name}, {days} days: daskhps retrain exited {run.returncode}:\n{run.stderr[-3000:]}"
        )
    return time.perf_counter() - t


def _day(out: Path, name: str) -> dict[str, Any]:
    """The figures of a run folder after its latest retraining run."""
    reg = Registry(out / name / "versions")
    current = reg.current()
    assert current is not None
    ckpt = load_checkpoint(out / name / "versions" / current.name)
    info = describe_checkpoint(ckpt)
    if any(s["store_rows"] is None for s in info["shards"]):
        raise SystemExit(f"{name}: the stores of {current.name} did not open: {info['damage']}")
    attempt = sorted((out / name / "attempts").iterdir())[-1]
    lines = [json.loads(x) for x in (attempt / "metrics.jsonl").read_text().splitlines()]
    passes = [x for x in lines if "pass" in x]
    counting = sum(x["seconds"].get(k, 0.0) for x in passes for k in COUNTING)
    total = sum(x["seconds"].get(k, 0.0) for x in passes for k in PASS_PARTS)
    return {
        "version": current.name,
        "scored_on": current.eval_day,
        "auc": current.metrics.get("auc"),
        "logloss": current.metrics.get("logloss"),
        "rows": info["rows"],
        "pending_keys": info.get("pending_keys") or 0,
        "disk_bytes": tree_bytes(out / name / "stores"),
        "counting_s": counting,
        "pass_s": total,
        "admitted": sum(x.get("admission", {}).get("admitted", 0) for x in passes),
        "expired": sum(x.get("expiry", {}).get("expired", 0) for x in passes),
    }


def plot(days: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """Three panels: table rows, disk bytes and scored-day AUC per day, both runs."""
    series = (("rows", "table rows"), ("disk_bytes", "store bytes on disk"), ("auc", "AUC"))
    colors = {"unbounded": "#d62728", "bounded": "#1f77b4"}
    w, h, pad = 300, 200, 44
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{3 * w}" height="{h + 20}" '
        'font-family="sans-serif" font-size="11">'
    ]
    n = max(len(v) for v in days.values())
    for i, (key, title) in enumerate(series):
        ox = i * w
        vals = [float(d[key]) for v in days.values() for d in v if d[key] is not None]
        lo, hi = (min(vals), max(vals)) if key == "auc" else (0.0, max(vals))
        hi = hi if hi > lo else lo + 1.0

        def sx(j: int, ox: int = ox) -> float:
            return ox + pad + j / max(n - 1, 1) * (w - pad - 10)

        def sy(y: float, lo: float = lo, hi: float = hi) -> float:
            return 20 + (h - pad - 10) * (1 - (y - lo) / (hi - lo))  # inside the frame

        out.append(f'<text x="{ox + pad}" y="14">{title}</text>')
        out.append(
            f'<rect x="{ox + pad}" y="20" width="{w - pad - 10}" height="{h - pad - 10}" '
            'fill="none" stroke="#999"/>'
        )
        out.append(f'<text x="{ox + 2}" y="{sy(hi) + 4:.1f}" font-size="9">{hi:.3g}</text>')
        out.append(f'<text x="{ox + 2}" y="{sy(lo):.1f}" font-size="9">{lo:.3g}</text>')
        out.append(f'<text x="{ox + pad}" y="{h + 14}" font-size="9">day 1 .. {n}</text>')
        for name, v in days.items():
            pts = " ".join(
                f"{sx(j):.1f},{sy(float(d[key])):.1f}"
                for j, d in enumerate(v)
                if d[key] is not None
            )
            out.append(f'<polyline points="{pts}" fill="none" stroke="{colors[name]}"/>')
        for k, (name, c) in enumerate(colors.items()):
            out.append(
                f'<text x="{ox + w - 90}" y="{34 + 12 * k}" fill="{c}" font-size="10">{name}</text>'
            )
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per figure")
    ap.add_argument("--days", type=int, default=14, help="days trained (one more is scored)")
    ap.add_argument("--rows-per-day", type=int, default=40_000)
    ap.add_argument("--vocab-scale", type=float, default=0.1)
    ap.add_argument("--drift", type=float, default=0.1, help="data.generate.drift")
    ap.add_argument("--one-off", type=float, default=0.3, help="data.generate.one_off")
    ap.add_argument("--min-count", type=int, default=2, help="table.admission.min_count")
    ap.add_argument("--ttl-days", type=int, default=3, help="table.expiry.ttl_days")
    ap.add_argument("--keep-versions", type=int, default=2, help="retrain.keep_versions")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None, help="working folder (default: a temporary one)")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="daskhps-lifecycle-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rep = Reporter(args.json)
    days: dict[str, list[dict[str, Any]]] = {"unbounded": [], "bounded": []}
    for d in range(2, args.days + 2):  # the first run trains day 1 and scores day 2
        for name in days:
            seconds = _retrain(args, out, name, d)
            fig = {**_day(out, name), "seconds": seconds, "load_avg": os.getloadavg()[0]}
            days[name].append(fig)
            print(
                f"# {name} day {d - 1}: auc {fig['auc']:.5f}, {fig['rows']:,} rows, "
                f"{fig['pending_keys']:,} pending, {fig['disk_bytes'] / 2**20:.1f} MiB, "
                f"counting {fig['counting_s']:.2f} of {fig['pass_s']:.2f} s, load "
                f"{fig['load_avg']:.1f}",
                file=sys.stderr,
                flush=True,
            )
        (out / "lifecycle.json").write_text(
            json.dumps({"args": vars(args), "days": days}, indent=1)
        )
    plot(days, out / "lifecycle.svg")
    last_b, last_u = days["bounded"][-1], days["unbounded"][-1]
    rep.emit(
        "last-day AUC, bounded - unbounded",
        last_b["auc"] - last_u["auc"],
        "auc",
        goal=f">= {GOAL_AUC_GAP}",
        bounded=last_b["auc"],
        unbounded=last_u["auc"],
    )
    rep.emit(
        "last-day table rows, bounded / unbounded",
        last_b["rows"],
        "rows",
        baseline=last_u["rows"],
        baseline_name="unbounded rows",
        goal=f"ratio <= {GOAL_ROWS}",
    )
    rep.emit(
        "last-day store bytes, bounded / unbounded",
        last_b["disk_bytes"],
        "bytes",
        baseline=last_u["disk_bytes"],
        baseline_name="unbounded bytes",
    )
    for name, v in days.items():
        shares = sorted(x["counting_s"] / x["pass_s"] for x in v if x["pass_s"])
        rep.emit(
            f"{name}: counting stages (admit, count, expire) / pass time, median over days",
            shares[len(shares) // 2],
            "share",
            goal=f"<= {GOAL_COUNTING}",
            worst=shares[-1],
        )
    print(f"# figures and plot in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()

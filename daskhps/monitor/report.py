"""The run report: one self-contained HTML file with the plots inline, and the PNGs beside it.

::

    <run dir>/metrics.jsonl  (one record per pass)  ─┐
    <run dir>/summary.json   (optional)              ├─► <run dir>/report/report.html
    ceiling AUC (generation.json of synthetic logs) ─┘    <run dir>/report/{loss,auc,...}.png

Plots per pass: training loss (every batch, and the pass mean) with the holdout logloss, holdout
AUC with the generator's ceiling when known, throughput, where staged rows came from (the
tiers' hit rates), the seconds of each stage and of each part of the training step. Drawn on
matplotlib's Agg canvas, so no display is needed.
"""

from __future__ import annotations

import base64
import html
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daskhps.errors import DataError

__all__ = ["RunRecords", "load_run", "write_report"]

log = logging.getLogger(__name__)

TIER_COLOURS = {"device": "#2b8cbe", "host": "#7bccc4", "store": "#fdae61", "init": "#bdbdbd"}


@dataclass
class RunRecords:
    """What a run directory says about its passes."""

    run_dir: Path
    passes: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    ceiling_auc: float | None = None


def load_run(run_dir: str | Path, ceiling_auc: float | None = None) -> RunRecords:
    """Read ``metrics.jsonl`` (and ``summary.json`` if present) of a run directory.

    Raises
    ------
    DataError
        The directory or its ``metrics.jsonl`` is missing, or a line is not a JSON record;
        the message names the file and line.
    """
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: no such run directory; give the run.dir of a training run")
    if not path.is_file():
        raise DataError(
            f"{path}: missing; is {run_dir} a run directory? (training writes metrics.jsonl "
            "there after each pass)"
        )
    passes = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise DataError(
                f"{path}: line {n} is not JSON ({e}); the run may have been killed while "
                "writing it: delete that line and run the report again"
            ) from e
        if isinstance(rec, dict) and "restart" in rec:
            continue  # an automatic restart's record (daskhps.training.recovery), not a pass
        if not isinstance(rec, dict) or "train_loss" not in rec:
            raise DataError(f"{path}: line {n} is not a pass record (no 'train_loss')")
        passes.append(rec)
    summary: dict[str, Any] = {}
    if (run_dir / "summary.json").is_file():
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except ValueError as e:
            raise DataError(f"{run_dir / 'summary.json'}: not JSON ({e})") from e
    if ceiling_auc is None:
        ceiling_auc = _ceiling(run_dir, summary)
    return RunRecords(run_dir, passes, summary, ceiling_auc)


def _ceiling(run_dir: Path, summary: dict[str, Any]) -> float | None:
    """The generator's ceiling AUC: from summary.json, else generation.json of the logs the
    run's config generated (synthetic logs only)."""
    if isinstance(summary.get("ceiling_auc"), int | float):
        return float(summary["ceiling_auc"])
    try:
        import yaml

        from daskhps.data.generation import ceiling_of

        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        return ceiling_of(str(cfg["data"]["generate"]["out"]))
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return None


# -- plots ---------------------------------------------------------------------------------


def _figure() -> Any:
    # A bare Figure (Agg canvas), not pyplot: no global backend or figure list to disturb.
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7, 3.6), dpi=100)
    ax = fig.subplots()
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # passes and batches are counts
    return fig, ax


def _loss(r: RunRecords) -> Any:
    fig, ax = _figure()
    step = 0
    xs: list[int] = []
    ys: list[float] = []
    ends: list[int] = []
    for p in r.passes:
        batch = p.get("batch_losses") or [p["train_loss"]]
        xs.extend(range(step + 1, step + len(batch) + 1))
        ys.extend(batch)
        step += len(batch)
        ends.append(step)
    ax.plot(xs, ys, lw=0.8, color="#9ecae1", label="batch")
    ax.plot(ends, [p["train_loss"] for p in r.passes], "o-", color="#08519c", label="pass mean")
    evals = [(e, p["eval"]["logloss"]) for e, p in zip(ends, r.passes, strict=True) if _ev(p)]
    if evals:
        ax.plot(*zip(*evals, strict=True), "s--", color="#d94801", label="holdout logloss")
    ax.set(xlabel="batch", ylabel="logloss", title="Training loss")
    ax.legend()
    return fig


def _numbers(r: RunRecords) -> list[int]:
    """Each record's pass number: counted from 1 over the run's schedule, as the terminal,
    the checkpoint names and metrics.jsonl count them (``pass``)."""
    return [int(p.get("pass", i + 1)) for i, p in enumerate(r.passes)]


def _ev(p: dict[str, Any], key: str = "logloss") -> bool:
    return isinstance(p.get("eval"), dict) and isinstance(p["eval"].get(key), int | float)


def _auc(r: RunRecords) -> Any:
    pts = [
        (n, p["eval"]["auc"]) for n, p in zip(_numbers(r), r.passes, strict=True) if _ev(p, "auc")
    ]
    if not pts:
        return None
    fig, ax = _figure()
    ax.plot(*zip(*pts, strict=True), "o-", color="#08519c", label="holdout AUC")
    if r.ceiling_auc is not None:
        ax.axhline(r.ceiling_auc, ls="--", color="#d94801", label="ceiling (true model)")
    _mark_model(r, ax, "auc")
    ax.set(xlabel="pass", ylabel="AUC", title="Holdout AUC")
    ax.legend()
    return fig


def _calibration(r: RunRecords) -> Any:
    """Mean prediction over the holdout's click rate, per pass: 1 is calibrated."""
    pts = [
        (n, p["eval"]["calibration"])
        for n, p in zip(_numbers(r), r.passes, strict=True)
        if _ev(p, "calibration")
    ]
    if not pts:
        return None
    fig, ax = _figure()
    ax.plot(*zip(*pts, strict=True), "o-", color="#08519c", label="mean prediction / CTR")
    ax.axhline(1.0, ls="--", color="#636363", label="calibrated")
    _mark_model(r, ax, "calibration")
    ax.set(xlabel="pass", ylabel="calibration", title="Holdout calibration")
    ax.legend()
    return fig


def _model_pass(r: RunRecords) -> int | None:
    """The pass of the run's model (its best checkpoint, ``eval.best_by``), if it names one."""
    model = r.summary.get("model") or {}
    return int(model["passes_done"]) if "passes_done" in model else None


def _mark_model(r: RunRecords, ax: Any, key: str) -> None:
    """A star on the pass whose checkpoint is the run's model."""
    best = _model_pass(r)
    for n, p in zip(_numbers(r), r.passes, strict=True):
        if n == best and _ev(p, key):
            ax.plot([n], [p["eval"][key]], "*", ms=14, color="#d94801", label="the run's model")


def _throughput(r: RunRecords) -> Any:
    fig, ax = _figure()
    ax.bar(_numbers(r), [p.get("examples_per_s", 0.0) for p in r.passes], color="#2b8cbe")
    ax.set(xlabel="pass", ylabel="examples / s", title="Training throughput")
    return fig


def _hit_rates(r: RunRecords) -> Any:
    fig, ax = _figure()
    bottom = [0.0] * len(r.passes)
    for tier, colour in TIER_COLOURS.items():
        frac = []
        for p in r.passes:
            src = p.get("staged_from") or {}
            total = sum(src.values())
            frac.append(src.get(tier, 0) / total if total else 0.0)
        ax.bar(_numbers(r), frac, bottom=bottom, color=colour, label=tier)
        bottom = [b + f for b, f in zip(bottom, frac, strict=True)]
    ax.set(xlabel="pass", ylabel="fraction of rows staged", title="Where staged rows came from")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


def _stacked(r: RunRecords, key: str, title: str) -> Any:
    """Bars per pass of the ``{stage: seconds}`` dicts under ``key``; None if no pass has one."""
    names: list[str] = []
    for p in r.passes:
        for k in p.get(key) or {}:
            if k not in names:
                names.append(k)
    if not names:
        return None
    fig, ax = _figure()
    bottom = [0.0] * len(r.passes)
    for k in names:
        secs = [float((p.get(key) or {}).get(k, 0.0)) for p in r.passes]
        ax.bar(_numbers(r), secs, bottom=bottom, label=k)
        bottom = [b + s for b, s in zip(bottom, secs, strict=True)]
    ax.set(xlabel="pass", ylabel="seconds", title=title)
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


def _stage_times(r: RunRecords) -> Any:
    return _stacked(r, "seconds", "Seconds per stage (driver's view)")


def _worker_times(r: RunRecords) -> Any:
    return _stacked(r, "worker_seconds", "Seconds per training-step stage (slowest rank)")


PLOTS = {
    "loss": _loss,
    "auc": _auc,
    "calibration": _calibration,
    "throughput": _throughput,
    "hit_rates": _hit_rates,
    "stage_times": _stage_times,
    "worker_stages": _worker_times,
}


# -- the report ----------------------------------------------------------------------------


def write_report(
    run_dir: str | Path, out: str | Path | None = None, *, ceiling_auc: float | None = None
) -> Path:
    """Write ``report.html`` and one PNG per plot to ``out`` (default ``<run dir>/report``);
    returns the HTML file's path."""
    records = load_run(run_dir, ceiling_auc)
    if not records.passes:
        raise DataError(
            f"{records.run_dir / 'metrics.jsonl'}: no pass has finished yet; run the report "
            "after the first pass"
        )
    folder = Path(out) if out is not None else records.run_dir / "report"
    folder.mkdir(parents=True, exist_ok=True)
    images: dict[str, bytes] = {}
    for name, plot in PLOTS.items():
        fig = plot(records)
        if fig is None:
            continue
        fig.tight_layout()
        path = folder / f"{name}.png"
        fig.savefig(path)
        images[name] = path.read_bytes()
    page = folder / "report.html"
    page.write_text(_html(records, images))
    log.info("run report: %s", page)
    return page


def _html(r: RunRecords, images: dict[str, bytes]) -> str:
    e = html.escape
    s = r.summary
    final = s.get("model_eval") or s.get("final_eval") or r.passes[-1].get("eval") or {}
    facts = [
        ("run", s.get("run", r.run_dir.name)),
        ("passes", len(r.passes)),
        ("examples", f"{sum(int(p.get('examples', 0)) for p in r.passes):,}"),
        ("final train loss", f"{r.passes[-1]['train_loss']:.4f}"),
    ]
    model = s.get("model") or {}
    if model:
        facts.append(
            (
                "model",
                f"{model['checkpoint']}: best holdout {model['metric']} (pass "
                f"{model['passes_done']}, marked *)",
            )
        )
    if s.get("stopped"):
        facts.append((f"stopped ({s['stopped']['kind']})", s["stopped"]["why"]))
    facts += [(f"holdout {k}", f"{v:.4f}") for k, v in final.items() if k != "examples"]
    if r.ceiling_auc is not None:
        facts.append(("ceiling AUC", f"{r.ceiling_auc:.4f}"))
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{e(str(c))}</td>"
            for c in (
                n,
                p.get("epoch", ""),
                p.get("examples", ""),
                f"{p['train_loss']:.4f}",
                f"{p['eval']['auc']:.4f}" if _ev(p, "auc") else "",
                f"{p['eval']['logloss']:.4f}" if _ev(p, "logloss") else "",
                f"{p['eval']['calibration']:.3f}" if _ev(p, "calibration") else "",
                "*" if n == _model_pass(r) else "",
                f"{p.get('examples_per_s', 0.0):,.0f}",
                p.get("rows_staged", ""),
            )
        )
        + "</tr>"
        for n, p in zip(_numbers(r), r.passes, strict=True)
    )
    figs = "".join(
        f'<figure><img alt="{e(n)}" src="data:image/png;base64,'
        f'{base64.b64encode(b).decode()}"><figcaption>{e(n)}.png</figcaption></figure>'
        for n, b in images.items()
    )
    missing = "" if "auc" in images else "<p>No holdout evaluation in this run: no AUC plot.</p>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>daskhps run {e(str(facts[0][1]))}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:60em}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}
figure{{margin:1em 0}}img{{max-width:100%}}</style></head><body>
<h1>daskhps run {e(str(facts[0][1]))}</h1>
<table>{"".join(f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in facts)}</table>
<h2>Passes</h2>
<table><tr><th>pass</th><th>epoch</th><th>examples</th><th>train loss</th><th>holdout AUC</th>
<th>holdout logloss</th><th>calibration</th><th>model</th><th>examples/s</th><th>rows staged</th>
</tr>{rows}</table>
<h2>Plots</h2>{missing}{figs}
</body></html>
"""

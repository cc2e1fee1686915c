"""The run report: PNGs that open and show something, an HTML page with them inline, clear
errors on a bad run directory; and a quiet ``daskhps train`` that writes it at the end."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.image import imread

from daskhps.cli import main
from daskhps.errors import DataError
from daskhps.monitor.report import PLOTS, load_run, write_report
from tests._clusters import WORKER_MEMORY

ROOT = Path(__file__).resolve().parents[2]


def _record(i: int, *, auc: bool = True) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "pass": i + 1,  # as the trainer numbers them: from 1
        "epoch": 1,
        "pass_in_epoch": i + 1,
        "examples": 1000,
        "examples_per_s": 20000.0 + 1000 * i,
        "train_loss": 0.6 - 0.05 * i,
        "batch_losses": [0.62 - 0.05 * i - 0.01 * b for b in range(5)],
        "rows_staged": 900,
        "staged_from": {"device": 100 * i, "host": 50, "store": 20 * i, "init": 900 - 150 * i},
        "seconds": {"route": 0.1, "stage": 0.2 + 0.1 * i, "train": 1.0, "eval": 0.3},
        "worker_seconds": {"pull": 0.2, "forward_backward": 0.5 + 0.1 * i, "push": 0.2},
    }
    if auc:
        rec["eval"] = {
            "auc": 0.6 + 0.05 * i,
            "logloss": 0.55 - 0.02 * i,
            "calibration": 0.8 + 0.05 * i,
            "examples": 500.0,
        }
    return rec


def _run_dir(tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text(json.dumps({"run": "unit", "ceiling_auc": 0.8}))
    return run


def _check_png(path: Path) -> None:
    img = imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    rgb = img[..., :3]
    assert float(rgb.std()) > 0.05  # not a blank canvas
    non_white = (rgb < 0.9).any(axis=2).mean()
    assert non_white > 0.02  # axes, lines and bars cover a visible part


def _inline_images(page: Path) -> dict[str, bytes]:
    text = page.read_text()
    found = re.findall(r'<img alt="(\w+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    return {name: base64.b64decode(data) for name, data in found}


def test_report_has_every_plot_as_png_and_inline(tmp_path):
    run = _run_dir(tmp_path, [_record(i) for i in range(4)])
    page = write_report(run)
    assert page == run / "report" / "report.html"
    inline = _inline_images(page)
    assert set(inline) == set(PLOTS)
    for name, data in inline.items():
        png = run / "report" / f"{name}.png"
        _check_png(png)
        assert data == png.read_bytes()  # the page needs no file beside it
    text = page.read_text()
    assert "<td>0.7500</td>" in text  # last pass's AUC in the pass table
    assert "ceiling AUC</th><td>0.8000" in text


def test_plots_and_table_number_passes_as_the_records_do(tmp_path):
    # a resumed two-epoch run's records: pass numbers from 1 over the run, not per epoch
    records = [{**_record(i), "epoch": 1 + i // 2, "pass_in_epoch": 1 + i % 2} for i in range(4)]
    run = _run_dir(tmp_path, records)
    loaded = load_run(run)
    assert list(PLOTS["auc"](loaded).axes[0].lines[0].get_xdata()) == [1, 2, 3, 4]
    bars = PLOTS["throughput"](loaded).axes[0].patches
    assert [round(b.get_x() + b.get_width() / 2) for b in bars] == [1, 2, 3, 4]
    table = write_report(run).read_text().split("<h2>Passes</h2>")[1]
    cells = re.findall(r"<tr><td>(\d+)</td><td>(\d+)</td>", table)
    assert cells == [("1", "1"), ("2", "1"), ("3", "2"), ("4", "2")]


def test_the_runs_model_is_marked_on_the_holdout_curves_and_in_the_table(tmp_path):
    # the run's model is its best checkpoint (eval.best_by), not its last pass
    run = _run_dir(tmp_path, [_record(i) for i in range(4)])
    summary = json.loads((run / "summary.json").read_text())
    summary["model"] = {
        "checkpoint": "pass-000002",
        "metric": "auc",
        "value": 0.65,
        "passes_done": 2,
    }
    summary["model_eval"] = _record(1)["eval"]
    (run / "summary.json").write_text(json.dumps(summary))
    loaded = load_run(run)
    for plot, value in (("auc", 0.65), ("calibration", 0.85)):
        marks = [
            line
            for line in PLOTS[plot](loaded).axes[0].lines
            if line.get_label() == "the run's model"
        ]
        assert len(marks) == 1, plot
        assert list(marks[0].get_xdata()) == [2]
        assert list(marks[0].get_ydata()) == pytest.approx([value])
    text = write_report(run).read_text()
    assert "pass-000002: best holdout auc (pass 2, marked *)" in text
    rows = re.findall(r"<tr><td>(\d+)</td>.*?</tr>", text.split("<h2>Passes</h2>")[1])
    starred = re.findall(r"<tr><td>(\d+)</td>(?:<td>[^<]*</td>){6}<td>\*</td>", text)
    assert rows == ["1", "2", "3", "4"] and starred == ["2"]
    assert "holdout auc</th><td>0.6500" in text  # the model's holdout, not the last pass's


def test_without_evaluation_there_is_no_auc_plot(tmp_path):
    run = _run_dir(tmp_path, [_record(i, auc=False) for i in range(2)])
    page = write_report(run, tmp_path / "elsewhere")
    assert page.parent == tmp_path / "elsewhere"
    assert "auc" not in _inline_images(page) and not (page.parent / "auc.png").exists()
    assert "No holdout evaluation" in page.read_text()
    _check_png(page.parent / "loss.png")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such run directory"),
        ("", "no pass has finished yet"),
        ('{"pass": 1, "train_loss": 0.5}\n{"pass": 2, "train_lo', "line 2 is not JSON"),
        ('{"pass": 1}\n', "line 1 is not a pass record"),
    ],
)
def test_bad_run_directories_name_the_file_and_line(tmp_path, content, message):
    run = tmp_path / "run"
    if content is not None:
        run.mkdir()
        (run / "metrics.jsonl").write_text(content)
    with pytest.raises(DataError, match=message):
        write_report(run)
    assert not (run / "report").exists()  # nothing half-written


def test_missing_metrics_says_what_a_run_directory_is(tmp_path):
    with pytest.raises(DataError, match=r"metrics.jsonl: missing; is .* a run directory"):
        load_run(tmp_path)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daskhps.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def test_cli_report_prints_the_page_or_one_error_line(tmp_path, capsys):
    run = _run_dir(tmp_path, [_record(0)])
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == str(run / "report" / "report.html") and out.err == ""
    assert main(["report", str(tmp_path / "nope")]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.strip().splitlines() == [
        f"daskhps report: error: {tmp_path / 'nope'}: no such run directory; give the run.dir "
        "of a training run"
    ]


@pytest.mark.slow
def test_quiet_training_writes_the_report_and_only_warnings(tmp_path):
    cfg = {
        "run": {"name": "quiet", "dir": str(tmp_path / "run"), "seed": 1, "quiet": True},
        "data": {
            "generate": {
                "out": str(tmp_path / "logs"),
                "days": 2,
                "rows_per_day": 1500,
                "parts_per_day": 2,
                "vocab_scale": 0.01,
            },
            "holdout": {"day": "last"},
        },
        "passes": {"epochs": 1, "examples_per_pass": 500, "global_batch_size": 100},
        "table": {"dim": 4, "tiers": {"device": {"rows": 50_000}, "host": {"fraction": 0.05}}},
        "model": {"name": "dlrm", "options": {"bottom_mlp": [8, 4], "top_mlp": [8]}},
        "cluster": {"n_workers": 1, "threads_per_worker": 2, "memory_limit": WORKER_MEMORY},
    }
    path = tmp_path / "quiet.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    res = _cli("train", str(path))
    assert res.returncode == 0, res.stderr
    # No progress bars, no Dask chatter: nothing but warnings and errors, if any.
    noise = [
        line
        for line in res.stderr.splitlines()
        if line.strip() and not line.startswith(("WARNING", "ERROR", "CRITICAL"))
    ]
    assert noise == [], res.stderr
    assert "\r" not in res.stderr
    page = tmp_path / "run" / "report" / "report.html"
    assert f"report: {page}" in res.stdout
    inline = _inline_images(page)
    assert set(inline) == set(PLOTS)
    for name in inline:
        _check_png(page.parent / f"{name}.png")
    passes = load_run(tmp_path / "run")
    assert len(passes.passes) == 3 and passes.ceiling_auc is not None
    assert np.isfinite([p["train_loss"] for p in passes.passes]).all()

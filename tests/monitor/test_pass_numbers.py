"""One pass numbering everywhere a user reads it: pass n of the run's schedule, counted from 1
over all epochs, is "pass n/N" on the terminal, ``"pass": n`` in metrics.jsonl, row n of the
report's table, x = n in its plots, and the checkpoint taken after it is ``pass-00000n``
(n passes done), which ``daskhps inspect`` describes as after pass n."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from daskhps.monitor.report import PLOTS, load_run
from daskhps.runfiles.checkpoint import list_checkpoints
from daskhps.training.inspection import describe, render
from tests._clusters import WORKER_MEMORY

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "daskhps.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def _table_rows(page: Path) -> list[list[str]]:
    """The cells of the report's pass table, row by row."""
    table = page.read_text().split("<h2>Passes</h2>")[1].split("</table>")[0]
    return [re.findall(r"<td>([^<]*)</td>", row) for row in table.split("<tr>")[2:]]


@pytest.mark.slow
def test_terminal_metrics_report_plots_and_checkpoints_agree(tmp_path: Path) -> None:
    cfg = {
        "run": {"name": "numbers", "dir": str(tmp_path / "run"), "seed": 1},
        "data": {
            "generate": {
                "out": str(tmp_path / "logs"),
                "days": 2,
                "rows_per_day": 800,
                "parts_per_day": 2,
                "vocab_scale": 0.01,
            },
            "holdout": {"day": "last"},
        },
        # 800 training rows: 2 passes an epoch, 2 epochs
        "passes": {"epochs": 2, "examples_per_pass": 400, "global_batch_size": 100},
        "table": {"dim": 4, "tiers": {"device": {"rows": 50_000}, "host": {"fraction": 0.05}}},
        "model": {"name": "dlrm", "options": {"bottom_mlp": [8, 4], "top_mlp": [8]}},
        "cluster": {
            "n_workers": 1,
            "threads_per_worker": 2,
            "memory_limit": WORKER_MEMORY,
            "gpu": False,
        },
        "checkpoint": {"every_passes": 1, "keep": 10},
    }
    path = tmp_path / "numbers.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    res = _cli("train", str(path))
    assert res.returncode == 0, res.stderr
    run = tmp_path / "run"
    want = [1, 2, 3, 4]

    terminal = sorted({int(n) for n in re.findall(r"pass (\d+)/4", res.stderr)})
    assert terminal == want, res.stderr

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["pass"] for r in records] == want
    assert [r["epoch"] for r in records] == [1, 1, 2, 2]
    assert [r["pass_in_epoch"] for r in records] == [1, 2, 1, 2]

    rows = _table_rows(run / "report" / "report.html")
    assert [(int(r[0]), int(r[1])) for r in rows] == [(1, 1), (2, 1), (3, 2), (4, 2)]

    loaded = load_run(run)
    auc = PLOTS["auc"](loaded).axes[0]
    assert list(auc.lines[0].get_xdata()) == want
    for name in ("throughput", "hit_rates"):
        bars = PLOTS[name](loaded).axes[0].patches
        assert sorted({round(b.get_x() + b.get_width() / 2) for b in bars}) == want, name

    ckpts = list_checkpoints(run)
    assert [c.name for c in ckpts] == [f"pass-{n:06d}" for n in want]
    for c, rec in zip(ckpts, records, strict=True):
        m = c.manifest
        assert (c.passes_done, m["pass"], m["epoch"], m["pass_in_epoch"]) == (
            rec["pass"],
            rec["pass"],
            rec["epoch"],
            rec["pass_in_epoch"],
        )
        state = json.loads((c.path / "state.json").read_text())
        assert state["pass"] == state["passes_done"] == rec["pass"] and state["record"] == rec
    text = render(describe(run))
    assert "pass-000004 (" in text and "after pass 4 (epoch 2)" in text

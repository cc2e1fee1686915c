"""docs/python-api.md's script, as written there, trains in a fresh interpreter: a spawned
LocalCluster of worker processes and the ``__main__`` guard the page explains. Run on a tiny
config saved under the name the script uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._clusters import WORKER_MEMORY

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "python-api.md"

TINY = {
    "run": {"name": "quickstart", "seed": 0},
    "data": {
        "generate": {"out": "data/quickstart", "days": 2, "rows_per_day": 800, "parts_per_day": 2,
                     "vocab_scale": 0.01},
        "holdout": {"day": "last"},
    },
    "passes": {"epochs": 2, "examples_per_pass": 400, "global_batch_size": 100},
    "table": {"dim": 4, "tiers": {"device": {"rows": 50_000}, "host": {"fraction": 0.05}}},
    "model": {"name": "dlrm", "options": {"bottom_mlp": [8, 4], "top_mlp": [8]}},
    # worker processes, started by spawn: what the guard is for
    "cluster": {"n_workers": 1, "threads_per_worker": 2, "memory_limit": WORKER_MEMORY,
                "processes": True, "gpu": False},
}  # fmt: skip


def documented_script() -> str:
    """The first Python block after the page's note that this test runs it."""
    after = DOC.read_text().split("tests/test_python_api.py", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_script_has_the_guard() -> None:
    script = documented_script()
    assert 'if __name__ == "__main__":' in script and "daskhps.train(" in script
    compile(script, "train.py", "exec")


@pytest.mark.slow
def test_documented_script_trains_in_a_fresh_interpreter(tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "quickstart.yaml").write_text(json.dumps(TINY))  # JSON is YAML
    (tmp_path / "train.py").write_text(documented_script())
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    res = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    # the script's lines (the generation's progress bar goes to stdout too)
    lines = [x for x in res.stdout.splitlines() if x.startswith(("pass ", "holdout "))]
    # the page's override (passes.epochs=1) applied: one epoch of 2 passes
    assert [x.split(":")[0] for x in lines[:-1]] == ["pass 1 (epoch 1)", "pass 2 (epoch 1)"]
    assert lines[-1].startswith("holdout AUC 0.") and "run directory runs/from-python" in lines[-1]
    assert (tmp_path / "runs" / "from-python" / "metrics.jsonl").is_file()

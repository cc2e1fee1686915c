"""Quality: on generated logs daskhps's holdout AUC is at least a plain-PyTorch baseline's
minus 0.002 (the same rows, order, optimizers and initial weights; scripts/bench_quality.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import bench_quality  # noqa: E402

TINY = {
    **bench_quality.QUICK,
    "gen": {"days": 2, "rows_per_day": 6_000, "parts_per_day": 2, "vocab_scale": 0.005},
    "examples_per_pass": 3_000,
}


@pytest.mark.slow
def test_daskhps_holdout_auc_matches_the_plain_pytorch_baseline(tmp_path: Path) -> None:
    generation = bench_quality.make_logs(tmp_path / "logs", TINY, seed=5)
    ours, base = bench_quality.compare(tmp_path / "logs", tmp_path, TINY, workers=1)
    assert ours["passes"] == TINY["epochs"] * 2
    assert ours["examples"] == base["examples"] == TINY["gen"]["rows_per_day"]
    assert ours["auc"] >= base["auc"] - bench_quality.GOAL_AUC_GAP
    # both learned something real, and neither beat the planted model
    ceiling = bench_quality.ceiling_of(generation, None)
    for auc in (ours["auc"], base["auc"]):
        assert 0.55 < auc <= ceiling + 0.01

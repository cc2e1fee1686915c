"""Quality: on generated logs daskhps's holdout AUC is at least a plain-PyTorch baseline's
minus 0.002 (the same rows, order, optimizers and initial weights; scripts/bench_quality.py).
The daskhps run trains on the session's warm shared cluster of its shape (tests/_clusters.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from daskhps.config import RunConfig
from tests._clusters import SharedClusters

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import bench_quality  # noqa: E402

TINY = {
    **bench_quality.QUICK,
    "gen": {"days": 2, "rows_per_day": 6_000, "parts_per_day": 2, "vocab_scale": 0.005},
    "examples_per_pass": 3_000,
}


@pytest.mark.slow
def test_daskhps_holdout_auc_matches_the_plain_pytorch_baseline(
    tmp_path: Path, shared_clusters: SharedClusters
) -> None:
    generation = bench_quality.make_logs(tmp_path / "logs", TINY, seed=5)
    cfg = bench_quality.make_config(tmp_path / "logs", tmp_path / "run", TINY, workers=1, seed=0)
    d = cfg.to_dict()
    d["cluster"] = shared_clusters.section(workers=1, threads=2)  # the script's shape
    cfg = RunConfig.from_dict(d, source=cfg.source)
    ours, base = bench_quality.run_daskhps(cfg), bench_quality.run_baseline(cfg)
    assert ours["passes"] == TINY["epochs"] * 2
    assert ours["examples"] == base["examples"] == TINY["gen"]["rows_per_day"]
    assert ours["auc"] >= base["auc"] - bench_quality.GOAL_AUC_GAP
    # both learned something real, and neither beat the planted model
    ceiling = bench_quality.ceiling_of(generation, None)
    for auc in (ours["auc"], base["auc"]):
        assert 0.55 < auc <= ceiling + 0.01

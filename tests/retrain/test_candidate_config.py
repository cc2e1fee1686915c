"""The config of a candidate run, and which changes a warm start refuses (no cluster)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from daskhps.config import RunConfig
from daskhps.errors import ConfigError
from daskhps.retrain.candidate import candidate_config, check_warm_start, day_data
from daskhps.retrain.days import DayPlan
from daskhps.runfiles.checkpoint import Checkpoint
from tests._runs import config_checkpoint

PLAN = DayPlan(train=("2024-01-02", "2024-01-03"), eval_day="2024-01-04")


def _cfg(**table: object) -> RunConfig:
    return RunConfig.from_dict(
        {
            "run": {"dir": "runs/rt"},
            "data": {"train": {"paths": "logs"}},
            "table": {"dim": 8, **table},
            "eval": {"metrics": ["ne"]},
        }
    )


def test_candidate_config(tmp_path: Path) -> None:
    cfg = candidate_config(
        _cfg(), day_data(_cfg(), PLAN), tmp_path / "attempts" / "a1", tmp_path / "stores"
    )
    assert cfg.run.dir == str(tmp_path / "attempts" / "a1")
    assert cfg.data.train is not None
    assert cfg.data.train.days == ("2024-01-02", "2024-01-04") and cfg.data.train.require_complete
    assert cfg.data.holdout is not None and cfg.data.holdout.day == "2024-01-04"
    assert cfg.table.tiers.store_dir == str(tmp_path / "stores")
    assert cfg.eval.metrics == ("ne", "auc", "logloss")  # what the guard reads
    assert cfg.checkpoint.due(3, last=True) and not cfg.checkpoint.due(1, last=False)
    assert cfg.checkpoint.replicate_to is None
    # a valid run config on its own (it is written to the attempt's config.yaml)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


def test_each_attempt_copies_its_checkpoints_to_a_location_of_its_own(tmp_path: Path) -> None:
    base = _cfg()
    copying = dataclasses.replace(
        base, checkpoint=base.checkpoint.replace(replicate_to="file:///shared/rt/")
    )
    a1, a2 = (
        candidate_config(
            copying, day_data(copying, PLAN), tmp_path / "attempts" / a, tmp_path / "stores"
        )
        for a in ("a1", "a2")
    )
    assert a1.checkpoint.replicate_to == "file:///shared/rt/attempts/a1"
    assert a2.checkpoint.replicate_to == "file:///shared/rt/attempts/a2"


def _base(cfg: RunConfig, tmp_path: Path) -> Checkpoint:
    return config_checkpoint(tmp_path / "v000001", cfg.to_dict())


def test_warm_start_accepts_day_to_day_changes(tmp_path: Path) -> None:
    base = _base(_cfg(), tmp_path)
    new = _cfg(optimizer={"kind": "adagrad", "lr": 0.5})
    new = dataclasses.replace(new, cluster=new.cluster.replace(n_workers=1), source="next.yaml")
    check_warm_start(
        base, candidate_config(new, day_data(new, PLAN), tmp_path / "a", tmp_path / "s")
    )


@pytest.mark.parametrize(
    ("change", "key"),
    [({"dim": 16}, "table.dim"), ({"optimizer": {"kind": "adam"}}, "table.optimizer.kind")],
)
def test_warm_start_refuses_what_changes_stored_rows(
    tmp_path: Path, change: dict, key: str
) -> None:
    base = _base(_cfg(), tmp_path)
    with pytest.raises(ConfigError, match=rf"{key}: .*put the published values back"):
        check_warm_start(base, _cfg(**change))

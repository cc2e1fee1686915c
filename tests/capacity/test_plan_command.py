"""``daskhps plan`` and ``train``'s early refusal, through the command line's ``main`` in this
process (tests/_runs.py ``cli_here``: the code ``python -m daskhps.cli`` runs, without a fresh
interpreter's imports each time; none of them starts a cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from daskhps.capacity import scan_key_stats, size_run
from daskhps.config import load_config
from daskhps.data.readers import read_click_log
from daskhps.sharding import ShardMap
from tests._clusters import PLANNED_MEMORY
from tests._logs import generated_logs
from tests._runs import cli_here


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logs(tmp_path_factory, days=1, rows_per_day=3000, parts_per_day=3, seed=2)


def _write(tmp: Path, logs: Path, **table: object) -> Path:
    cfg = {
        "run": {"name": "p", "dir": str(tmp / "run"), "quiet": True},
        "data": {"train": {"paths": [str(logs)]}},
        "passes": {"examples_per_pass": 1000, "global_batch_size": 100, "num_shards": 8},
        "table": {"dim": 8, "tiers": {"device": {"rows": 5000}, "host": {"fraction": 0.05}}},
        "cluster": {"n_workers": 2, "memory_limit": PLANNED_MEMORY, "gpu": False},
    }
    cfg["table"].update(table)  # type: ignore[union-attr]
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_scan_counts_match_a_brute_force_count(tmp_path: Path, logs: Path) -> None:
    cfg = load_config(_write(tmp_path, logs))
    stats = scan_key_stats(cfg, workers=2)
    frame = read_click_log(cfg.data.source).frame.compute()
    keys = frame[[c for c in frame.columns if c.startswith("C")]].to_numpy(np.int64)
    shard_map = ShardMap(8, 2)

    def owners(k: np.ndarray) -> np.ndarray:
        return (shard_map.shard(k) * 2) // 8

    every = np.unique(keys)
    assert stats.distinct_keys == every.size
    assert stats.keys_per_owner == max(np.bincount(owners(every), minlength=2))
    per_pass = [np.unique(keys[a : a + 1000]) for a in range(0, len(keys), 1000)]
    want = [int(max(np.bincount(owners(p), minlength=2))) for p in per_pass]
    assert list(stats.pass_keys_per_owner) == want
    assert stats.largest_pass_keys == max(p.size for p in per_pass)
    assert stats.examples == len(pd.Index(frame.index)) and stats.passes == 3


@pytest.mark.slow
def test_plan_prints_every_part_and_json_agrees(
    tmp_path: Path,
    logs: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = _write(tmp_path, logs)
    text = cli_here(capfd, caplog, "plan", str(path), "--scan")
    assert text.returncode == 0, text.stderr
    for part in ("device tier", "host tier", "zarr store", "dense model", "fits: yes"):
        assert part in text.stdout
    out = cli_here(capfd, caplog, "plan", str(path), "--scan", "--json")
    report = json.loads(out.stdout)
    direct = size_run(load_config(path), scan=True)
    assert report["memory_per_worker"]["total"] == direct.memory.total  # type: ignore[union-attr]
    assert report["keys"]["source"] == "scan" and report["fits"] is True


@pytest.mark.slow
def test_plan_and_train_refuse_a_pass_larger_than_the_device_tier(
    tmp_path: Path,
    logs: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 200k expected keys: a pass of 1000 examples x 26 fields stages ~13k per worker.
    path = _write(tmp_path, logs, expected_keys=200_000)
    plan = cli_here(capfd, caplog, "plan", str(path))
    assert plan.returncode == 1
    refusal = plan.stderr.strip().splitlines()
    assert len(refusal) == 1 and "device tier holds 5,000 rows" in refusal[0]
    assert refusal[0].startswith("daskhps plan: error: ") and "Traceback" not in plan.stderr
    train = cli_here(capfd, caplog, "train", str(path))
    assert train.returncode == 1 and "Traceback" not in train.stderr
    lines = train.stderr.strip().splitlines()
    assert lines[-1].removeprefix("daskhps train: error: ") == refusal[0].removeprefix(
        "daskhps plan: error: "
    )
    assert not (tmp_path / "run").exists()  # refused before writing anything


@pytest.mark.slow
def test_plan_refuses_a_store_larger_than_the_free_disk(
    tmp_path: Path,
    logs: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = _write(tmp_path, logs, expected_keys=10**13, tiers={"device": {"rows": 10**5}})
    plan = cli_here(capfd, caplog, "plan", str(path))
    assert plan.returncode == 1
    assert "free" in plan.stderr and "table.tiers.store_dir" in plan.stderr


def test_config_bounds_without_a_scan_are_warnings(tmp_path: Path, logs: Path) -> None:
    cfg = load_config(_write(tmp_path, logs, tiers={"device": {"rows": 100}}))
    report = size_run(cfg)
    assert report.keys.source == "bound" and report.fits
    # The pass over the device tier is plan's to say, as an upper bound (train checks each
    # pass when it stages it); the memory warning from the same bound says it is one.
    (bound,) = report.upper_bounds
    assert bound.startswith("a pass stages at most ") and "(an upper bound; `daskhps" in bound
    assert not any("pass" in w for w in report.warnings)
    assert all("upper bound" in w for w in report.warnings)


def test_a_peak_over_the_pause_threshold_is_refused_naming_the_key(tmp_path: Path) -> None:
    # 100k holdout rows per worker in one evaluation batch: the DLRM's activations alone
    # (about 8 KiB a row) pass 80% of 1 GiB. The tiers are tiny and the key count stated.
    cfg = {
        "run": {"name": "p", "dir": str(tmp_path / "run"), "quiet": True},
        "data": {
            "generate": {"out": str(tmp_path / "logs"), "days": 2, "rows_per_day": 200_000},
            "holdout": {"day": "last"},
        },
        "passes": {"examples_per_pass": 50_000},
        "table": {
            "dim": 16,
            "expected_keys": 10_000,
            "tiers": {"device": {"rows": 20_000}, "host": {"fraction": 0.01}},
        },
        "eval": {"batch_size": 100_000},
        "cluster": {"n_workers": 2, "memory_limit": PLANNED_MEMORY, "gpu": False},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    report = size_run(load_config(path))
    assert report.memory is not None and not report.fits
    (problem,) = report.problems
    assert "the largest part is one evaluation batch" in problem
    assert "lower eval.batch_size (now 100000)" in problem
    assert report.memory.eval_step == report.memory.transient > 700 << 20
    # Smaller batches fit: predictions do not depend on them.
    path.write_text(yaml.safe_dump({**cfg, "eval": {"batch_size": 8192}}))
    assert size_run(load_config(path)).fits
    # Larger passes do not, and the refusal says which key that is.
    path.write_text(
        yaml.safe_dump(
            {**cfg, "eval": {"batch_size": 8192}, "passes": {"examples_per_pass": 10**6}}
        )
    )
    (problem,) = size_run(load_config(path)).problems
    assert "lower passes.examples_per_pass or data.block_size" in problem

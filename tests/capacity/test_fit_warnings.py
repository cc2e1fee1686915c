"""What ``train`` and ``daskhps plan`` say about a pass and the device tier, and only that:

* a counted (``--scan``) pass larger than the device tier refuses the run, and ``train``
  without a scan stops, with the exact count, at the first pass that does not fit;
* an upper bound from the data's shape (``examples_per_pass x fields`` of click-log files)
  over the device tier is said by ``plan`` as one ("at most"), never by ``train``, which
  checks every pass exactly when it stages it;
* nothing is said of two passes together: the trainer stages a pass ahead where it fits beside
  the one training, and after it where it does not, pass by pass;
* a plain ``train`` does not say that the distinct keys are unknown (``plan`` does, where it
  sizes the disk).

The logs: one day of 2,000 rows, so 4 passes of 500 on one worker; a pass holds about 2,150
distinct keys, two consecutive passes about 3,350 together, and the bound of a pass is
500 x 26 = 13,000.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from daskhps.capacity import check_fits, size_run
from daskhps.config import RunConfig
from daskhps.errors import CapacityError
from daskhps.training.trainer import Trainer
from tests._clusters import SharedClusters
from tests._logs import generated_logs
from tests._runs import cli_here, tiny_config, write_config

BOUND = 500 * 26  # a pass's keys from the config: examples_per_pass x fields


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logs(tmp_path_factory, days=1, rows_per_day=2000, parts_per_day=2, seed=3)


def _config(tmp: Path, logs: Path, rows: int, cluster: dict[str, Any] | None = None) -> RunConfig:
    d = tiny_config(
        tmp / "run", logs, table={"tiers": {"device": {"rows": rows}}}, cluster_section=cluster
    )
    return RunConfig.from_dict(d, source="run.yaml")


def _path(tmp: Path, logs: Path, rows: int) -> Path:
    d = tiny_config(tmp / "run", logs, table={"tiers": {"device": {"rows": rows}}})
    return write_config(tmp / "run.yaml", d)


def _warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the sizing logged at WARNING or above."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("daskhps.capacity")
    ]


def test_a_train_whose_bound_exceeds_the_device_tier_but_whose_passes_fit_warns_nothing(
    tmp_path: Path, logs: Path, shared_clusters: SharedClusters, caplog: pytest.LogCaptureFixture
) -> None:
    # 4,000 rows: under the 13,000 of the bound and the 2 x 2,150 of two passes' counts, over
    # the union of two consecutive passes' keys: every pass is staged ahead.
    cfg = _config(tmp_path, logs, 4000, shared_clusters.section(workers=1, threads=2))
    caplog.set_level(logging.DEBUG, logger="daskhps.training.pipeline")  # "staged after"
    Trainer(cfg, progress=False).run()
    assert _warned(caplog) == []
    assert not [r for r in caplog.records if "staged after the previous one" in r.getMessage()]
    counted = size_run(_config(tmp_path, logs, 4000), scan=True)
    assert counted.keys.largest_pass_per_owner is not None
    assert 2 * counted.keys.largest_pass_per_owner > 4000 and BOUND > 4000
    assert counted.fits and counted.warnings == [] and counted.upper_bounds == []


def test_a_pass_the_run_cannot_stage_stops_it_with_the_exact_count(
    tmp_path: Path, logs: Path, shared_clusters: SharedClusters, caplog: pytest.LogCaptureFixture
) -> None:
    # 1,000 rows cannot hold any pass: plan --scan refuses; train, without a scan, starts (the
    # bound alone cannot tell) and stops at the first pass, with its count.
    cfg = _config(tmp_path, logs, 1000, shared_clusters.section(workers=1, threads=2))
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(CapacityError, match=r"staging 2,1\d\d ") as stopped,
    ):
        Trainer(cfg, progress=False).run()
    assert _warned(caplog) == []
    # the lever it names is a key of the config
    assert "lower passes.max_working_set" in str(stopped.value)
    report = size_run(_config(tmp_path, logs, 1000), scan=True)
    (problem,) = report.problems
    assert problem.startswith("the largest pass stages 2,1") and "holds 1,000 rows" in problem


def test_plan_says_a_bound_over_the_device_tier_is_one_and_train_says_nothing(
    tmp_path: Path,
    logs: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = _path(tmp_path, logs, 4000)
    plan = cli_here(capfd, caplog, "plan", str(path))
    assert plan.returncode == 0, plan.stderr
    (warning,) = [x for x in plan.stdout.splitlines() if x.startswith("warning:")]
    assert f"at most {BOUND:,} keys" in warning
    assert "(an upper bound; `daskhps plan --scan` counts them)" in warning
    assert "4,000 rows" in warning
    # plan sizes the disk, so it says why the stores are not sized; train says neither.
    assert "stores not sized: their distinct keys are unknown (--scan" in plan.stdout
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        report = check_fits(_config(tmp_path, logs, 4000))
    assert report.fits and report.warnings == [] and _warned(caplog) == []


def test_two_passes_over_the_device_tier_are_no_warning(
    tmp_path: Path,
    logs: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 20,000 rows hold the bound of a pass (13,000) but not of two: the trainer decides pass
    # by pass whether the next fits beside the one training, so neither plan nor train warns.
    path = _path(tmp_path, logs, 20_000)
    for args in (("plan", str(path)), ("plan", str(path), "--scan")):
        plan = cli_here(capfd, caplog, *args)
        assert plan.returncode == 0, plan.stderr
        assert "warning" not in plan.stdout + plan.stderr and "fits: yes" in plan.stdout
    # plan --scan of 4,000 rows: two passes' counts (2 x 2,150) are more, their union less
    plan = cli_here(capfd, caplog, "plan", str(_path(tmp_path / "b", logs, 4000)), "--scan")
    assert plan.returncode == 0 and "warning" not in plan.stdout + plan.stderr
    with caplog.at_level(logging.WARNING):
        check_fits(_config(tmp_path, logs, 20_000))
    assert _warned(caplog) == []

"""A run keeps its best checkpoint as its model, stops early after ``eval.patience``, and a
diverged run ends with one line and a non-zero exit (docs/checkpoints.md, "The run's model").

The command line's own ``main`` (tests/_runs.py ``cli_here``) trains on the session's warm
shared cluster: what is checked is what the run writes and says, not its process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from daskhps.data.badrows import BadRowPolicy
from daskhps.data.parse import read_shard
from daskhps.data.schema import criteo_schema
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.runfiles.checkpoint import list_checkpoints, model_checkpoint
from daskhps.serve.score import CacheSizes, Scorer
from daskhps.serve.version import load_servable
from tests._clusters import SharedClusters
from tests._runs import cli_here, tiny_config, write_config
from tests.runfiles.test_rundir import tree_digest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("best") / "logs"
    generate(
        GeneratorConfig(days=2, rows_per_day=2000, parts_per_day=2, seed=3, vocab_scale=0.01),
        str(out),
    )
    return out


@pytest.fixture
def section(shared_clusters: SharedClusters) -> dict[str, Any]:
    """The cluster section of the session's warm 1-worker cluster."""
    return shared_clusters.section(workers=1, threads=2)


def _config(tmp_path: Path, name: str, logs: Path, section: dict[str, Any], **over: Any) -> Path:
    d = tiny_config(
        tmp_path / name,
        logs,
        cluster_section=section,
        data={"holdout": {"day": "last"}},
        passes={"epochs": 2},  # 4 passes of 500 rows an epoch
        **over,
    )
    d["table"]["tiers"]["store_dir"] = str(tmp_path / f"{name}-stores")
    return write_config(tmp_path / f"{name}.yaml", d)


def _scores(model: Path, checkpoint: str | None, logs: Path) -> np.ndarray:
    frame, _ = read_shard(
        str(sorted((logs / "day=2024-01-02").glob("part-*"))[0]),
        criteo_schema(),
        BadRowPolicy(action="skip"),
    )
    scorer = Scorer(load_servable(model, checkpoint), CacheSizes(4096, 1 << 20))
    try:
        return scorer.score(frame.iloc[:300])
    finally:
        scorer.close()


def _passes(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_best_checkpoint_outlives_retention_and_is_what_the_run_serves(
    tmp_path: Path,
    logs: Path,
    section: dict[str, Any],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # every checkpoint kept: the reference rows of each pass
    every = _config(tmp_path, "every", logs, section, checkpoint={"keep": 20})
    # one kept, every one a base (the stores compacted each time), and no later pass counts
    # as better than the first: the first must survive seven compactions and prunes
    first = _config(
        tmp_path,
        "first",
        logs,
        section,
        checkpoint={"keep": 1, "full_every": 1},
        eval={"min_delta": 0.99},
    )
    for config in (every, first):
        done = cli_here(capfd, caplog, "train", str(config))
        assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "first"
    assert [c.name for c in list_checkpoints(run)] == ["pass-000001", "pass-000008"]
    assert "model: pass-000001 (best holdout auc, of pass 1)" in done.stdout
    assert "holdout of the last pass: " in done.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["model"]["checkpoint"] == "pass-000001"
    assert summary["model_eval"] == _passes(run)[0]["eval"]
    assert summary["final_eval"] == _passes(run)[-1]["eval"]
    # the run's model reads the rows pass 1 wrote, bit for bit, through every later base
    served = _scores(run, None, logs)
    assert np.array_equal(served, _scores(tmp_path / "every", "pass-000001", logs))
    assert not np.array_equal(served, _scores(run, "pass-000008", logs))
    # predict, serve and export say why the run gave it (Servable.chosen)
    chosen = load_servable(run).chosen
    assert "the run's model: its best holdout auc" in chosen and "pass 1;" in chosen
    assert "--checkpoint pass-000008 takes its latest" in chosen
    assert load_servable(run, "pass-000008").chosen == ""
    every = tmp_path / "every"  # says so only when its best is not its latest
    latest = model_checkpoint(every).name == list_checkpoints(every)[-1].name  # type: ignore[union-attr]
    assert (load_servable(every).chosen == "") == latest
    shown = cli_here(capfd, caplog, "inspect", str(run))
    assert shown.returncode == 0, shown.stderr
    head, _, tail = shown.stdout.partition("pass-000008 (")
    assert "the run's model: predict, serve and export take this checkpoint" in head
    assert "best so far: pass-000001 (auc " in tail and "the run's model:" not in tail


def test_an_early_stop_is_kept_by_a_resume_until_patience_is_raised(
    tmp_path: Path,
    logs: Path,
    section: dict[str, Any],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # nothing after the first pass is better: the second evaluation without one stops the run
    config = _config(tmp_path, "early", logs, section, eval={"min_delta": 0.99, "patience": 2})
    run = tmp_path / "early"
    done = cli_here(capfd, caplog, "train", str(config))
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(_passes(run)) == 3
    assert "stopped early after pass 3: no better holdout auc than " in done.stdout
    assert [c.name for c in list_checkpoints(run)] == ["pass-000001", "pass-000002", "pass-000003"]
    stopped = list_checkpoints(run)[-1].stopped
    assert stopped is not None and stopped["kind"] == "early" and stopped["since_best"] == 2

    before = tree_digest(run)
    again = cli_here(capfd, caplog, "train", str(config), "--resume")
    assert again.returncode == 0, again.stderr
    assert "stopped early after pass-000003" in again.stderr, again.stderr
    assert "--set eval.patience=3 (or null)" in again.stderr
    assert tree_digest(run) == before  # said, nothing written

    more = cli_here(capfd, caplog, "train", str(config), "--resume", "--set", "eval.patience=4")
    assert more.returncode == 0, more.stderr[-3000:]
    assert [p["pass"] for p in _passes(run)] == [1, 2, 3, 4, 5]  # stops at 4 in a row
    assert list_checkpoints(run)[-1].model["checkpoint"] == "pass-000001"  # type: ignore[index]


def test_a_diverged_run_exits_non_zero_naming_the_levers_and_keeps_its_best(
    tmp_path: Path,
    logs: Path,
    section: dict[str, Any],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A holdout logloss above 1.01x its best so far counts as diverged here: on these logs the
    # second epoch overfits, its holdout logloss rising past that within a few passes.
    config = _config(tmp_path, "diverged", logs, section, eval={"diverge_factor": 1.01})
    run = tmp_path / "diverged"
    done = cli_here(capfd, caplog, "train", str(config))
    assert done.returncode == 3, done.stderr[-3000:]
    passes = _passes(run)
    losses = [p["eval"]["logloss"] for p in passes]
    # it stopped at the first pass past the line, and that pass is no checkpoint
    assert losses[-1] > 1.01 * min(losses[:-1])
    assert all(loss <= 1.01 * min(losses[:i]) for i, loss in enumerate(losses[:-1]) if i)
    names = [c.name for c in list_checkpoints(run)]
    assert f"pass-{len(passes):06d}" not in names
    model = list_checkpoints(run)[-1].model
    assert model is not None and model["checkpoint"] in names
    error = [line for line in done.stderr.splitlines() if line.startswith("daskhps train: error")]
    assert len(error) == 1, done.stderr
    for words in (
        f"diverged at pass {len(passes)}",
        "eval.diverge_factor 1.01",
        "table.optimizer.lr, now 0.05",
        "dense_optimizer.lr, now 0.01",
        "dense_optimizer.grad_clip_norm",
        f"--resume --checkpoint {model['checkpoint']} --overwrite --set table.optimizer.lr=0.025",
    ):
        assert words in error[0], error[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"]["kind"] == "diverged"

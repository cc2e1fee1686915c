"""``daskhps retrain configs/retrain.yaml`` as the README lists it, on a fresh checkout: the
config's ``data.generate`` section writes its days on the first run (no `daskhps generate`
first), and raising ``data.generate.days`` brings the next day. The shipped config, shrunk
with ``--set`` to a few thousand rows on one worker, in a folder with no logs. The run that finds
nothing new goes through the command line's ``main`` in this process (it starts no cluster)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from daskhps.cli import main
from daskhps.retrain import ExitCode, Registry
from tests._clusters import WORKER_MEMORY

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "data.generate.rows_per_day=2000",
    "data.generate.parts_per_day=2",
    "data.generate.vocab_scale=0.01",
    "passes.examples_per_pass=1000",
    "passes.global_batch_size=250",
    "cluster.n_workers=1",
    f"cluster.memory_limit={WORKER_MEMORY}",
    "retrain.max_auc_drop=0.05",  # a few thousand rows: the guard is not the point here
    "retrain.max_logloss_rise=0.05",
]


def _args(*sets: str) -> list[str]:
    return ["retrain", "configs/retrain.yaml", *(a for s in (*SMALL, *sets) for a in ("--set", s))]


def _retrain(folder: Path, *sets: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "daskhps.cli", *_args(*sets)],
        capture_output=True,
        text=True,
        cwd=folder,  # the config's relative paths (data/retrain, runs/retrain) land here
        env=env,
        timeout=900,
    )


@pytest.mark.slow
def test_shipped_retrain_config_runs_on_a_fresh_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "retrain.yaml", tmp_path / "configs" / "retrain.yaml")
    assert not (tmp_path / "data").exists()

    first = _retrain(tmp_path)
    assert first.returncode == ExitCode.PUBLISHED, first.stderr[-3000:]
    assert "published v000001" in first.stdout and "on 2024-01-03" in first.stdout
    days = sorted(p.name for p in (tmp_path / "data" / "retrain").glob("day=*"))
    assert days == ["day=2024-01-01", "day=2024-01-02", "day=2024-01-03"]

    with monkeypatch.context() as here:
        here.chdir(tmp_path)  # the config's relative paths, as for the subprocesses
        again = main(_args())
    assert again == ExitCode.NOTHING_NEW, capsys.readouterr().err[-3000:]

    later = _retrain(tmp_path, "data.generate.days=4")  # the next day arrives
    assert later.returncode in (ExitCode.PUBLISHED, ExitCode.REJECTED), later.stderr[-3000:]
    attempt = Registry(tmp_path / "runs" / "retrain" / "versions").attempts()[-1]
    assert (attempt.base, attempt.train_days, attempt.eval_day) == (
        "v000001",
        ("2024-01-03",),
        "2024-01-04",
    )

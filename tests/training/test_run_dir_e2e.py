"""Nothing a user does with ``daskhps train`` destroys a trained run: every bad input is refused
with one line and leaves the run folder and its stores byte for byte as they were; a failed or
killed ``--overwrite`` puts the earlier run back; ``--resume --checkpoint`` of an earlier
checkpoint discards the later ones only with ``--overwrite``.

One trained run (1 worker, 2 passes, real LocalCluster, ``python -m daskhps.cli`` in a
subprocess) serves the whole module; the tests run in file order, those that change the run
last. The trains refused before any cluster starts go through the command line's ``main`` in
this process (tests/_runs.py ``cli_here``); every run that trains, fails on the cluster, is
killed or interrupted is a subprocess of its own.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from daskhps.runfiles.checkpoint import latest_checkpoint, list_checkpoints
from daskhps.runfiles.rundir import ASIDE
from tests._logs import generated_logs
from tests._runs import cli, cli_here, tiny_config, write_config
from tests._signals import default_dispositions
from tests.runfiles.test_rundir import tree_digest

pytestmark = pytest.mark.slow


def _config(folder: Path, logs: Path) -> Path:
    d = tiny_config(
        folder / "run",
        logs,
        data={"holdout": {"day": "last"}, "bad_rows": "fail"},
        checkpoint={"every_passes": 1, "keep": 3},
    )
    return write_config(folder / "run.yaml", d)


def _train(config: Path, *args: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    return cli("train", str(config), *args, kill_at=kill_at)


def _one_line_error(run: subprocess.CompletedProcess, *needles: str) -> None:
    assert run.returncode != 0, run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("daskhps train: error: "), run.stderr[-2000:]
    for n in needles:
        assert n in last, (n, last)


def _dense(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None
    return ckpt.dense_state()


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # day 1: 1000 rows = 2 passes of 500; day 2: the holdout
    return generated_logs(tmp_path_factory, days=2, rows_per_day=1000, parts_per_day=2, seed=5)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, logs: Path) -> Path:
    folder = tmp_path_factory.mktemp("trained")
    config = _config(folder, logs)
    run = _train(config)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [c.name for c in list_checkpoints(folder / "run")] == ["pass-000001", "pass-000002"]
    return config


def _digest(config: Path) -> str:
    return tree_digest(config.parent / "run")  # checkpoints, metrics, report, stores


@pytest.mark.parametrize(
    ("sets", "args", "needles"),
    [
        ([], [], ["already holds a run", "--resume", "--overwrite"]),
        (["data.train.paths=[/nonexistent/logs]"], ["--overwrite"], ["/nonexistent/logs"]),
        (["data.holdout.day=2031-01-01"], ["--overwrite"], ["2031-01-01"]),
        (["data.train.days=2030-01-01..2030-01-05"], ["--overwrite"], ["2030-01-01"]),
        (["table.tiers.store_dir=/proc/daskhps-stores"], ["--overwrite"], ["store_dir"]),
        (["cluster.gpu=true"], ["--overwrite"], ["cluster.gpu"]),
        (["table.dim=8"], ["--resume"], ["table.dim"]),
        ([], ["--resume", "--checkpoint", "pass-000009"], ["pass-000009", "pass-000002"]),
        ([], ["--resume", "--checkpoint", "pass-000001"], ["pass-000002", "--overwrite"]),
        ([], ["--checkpoint", "pass-000001"], ["--resume"]),
    ],
)
def test_a_bad_input_is_one_line_and_changes_nothing(
    trained: Path,
    sets: list[str],
    args: list[str],
    needles: list[str],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = _digest(trained)
    overrides = [a for s in sets for a in ("--set", s)]
    _one_line_error(cli_here(capfd, caplog, "train", str(trained), *overrides, *args), *needles)
    assert _digest(trained) == before


def test_a_failure_before_the_first_checkpoint_puts_the_earlier_run_back(
    trained: Path, logs: Path, tmp_path: Path
) -> None:
    """The new run's data has a malformed row under ``bad_rows: fail``: it fails on the
    cluster, after the earlier run was moved aside."""
    bad = tmp_path / "logs"
    shutil.copytree(logs, bad)
    part = sorted((bad / "day=2024-01-01").glob("part-*"))[0]
    with part.open("a") as f:
        f.write("not\ta\tclick\tlog\trow\n")
    before = _digest(trained)
    run = _train(trained, "--overwrite", "--set", f"data.train.paths=[{bad}]")
    assert run.returncode != 0 and "line 501: expected 40 columns" in run.stderr, run.stderr[-2000:]
    assert _digest(trained) == before
    assert not (trained.parent / "run" / ASIDE).exists()


def test_a_killed_overwrite_is_put_right_by_the_next_train(
    trained: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    before = _digest(trained)
    run = _train(trained, "--overwrite", "--set", "run.seed=2", kill_at="mid_pass:0")
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    assert (trained.parent / "run" / ASIDE).is_dir()  # the earlier run, aside
    # The next train of any kind settles it first: the new run left no checkpoint, so the
    # earlier run comes back (and this plain train is then refused, as it holds a run).
    _one_line_error(cli_here(capfd, caplog, "train", str(trained)), "already holds a run")
    assert _digest(trained) == before


def test_ctrl_c_before_the_new_runs_first_checkpoint_puts_the_earlier_run_back(
    trained: Path,
) -> None:
    before = _digest(trained)
    aside = trained.parent / "run" / ASIDE
    proc = subprocess.Popen(
        [sys.executable, "-m", "daskhps.cli", "train", str(trained), "--overwrite"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: SIGINT reaches it and its workers
        preexec_fn=default_dispositions,  # SIGINT heard, even when the suite runs in the background
    )
    try:
        deadline = time.monotonic() + 120
        while not aside.exists():  # moved aside: the cluster is starting, nothing trained yet
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("daskhps train: interrupted before the new run's first checkpoint"), (
        stderr[-6000:]
    )
    assert "is back as it was (last checkpoint pass-000002)" in last and "--overwrite" in last
    assert _digest(trained) == before and not aside.exists()


def test_resuming_an_earlier_checkpoint_needs_overwrite_and_ends_the_same(trained: Path) -> None:
    """From pass-000001 again: pass 2 is retrained to the same bits as the first time."""
    run_dir = trained.parent / "run"
    final = _dense(run_dir)
    run = _train(trained, "--resume", "--checkpoint", "pass-000001", "--overwrite")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "discarding checkpoint pass-000002" in run.stderr
    assert [c.name for c in list_checkpoints(run_dir)] == ["pass-000001", "pass-000002"]
    again = _dense(run_dir)
    assert final.keys() == again.keys()
    assert all(torch.equal(final[k], again[k]) for k in final)


def test_overwrite_replaces_the_run_once_the_new_one_has_a_checkpoint(trained: Path) -> None:
    run_dir = trained.parent / "run"
    old = _dense(run_dir)
    run = _train(trained, "--overwrite", "--set", "run.seed=7")
    assert run.returncode == 0, run.stderr[-3000:]
    assert not (run_dir / ASIDE).exists()
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        ["checkpoints", "config.yaml", "metrics.jsonl", "report", "stores", "summary.json"]
    )
    new = _dense(run_dir)
    assert any(not torch.equal(old[k], new[k]) for k in old)  # seed 7's model, not seed 1's
    assert "seed: 7" in (run_dir / "config.yaml").read_text()

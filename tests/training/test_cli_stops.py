"""``daskhps train`` stopping on purpose ends in one line, never a traceback or Dask's noise.

* a bad row under ``bad_rows: fail`` (quiet or not): the file and line, no ``Compute Failed``;
* a store or run folder that cannot be written: the path and the key to change, before any
  worker starts (through the command line's ``main`` in this process, tests/_runs.py
  ``cli_here``: nothing starts that could add noise, and every logged line is in its stderr);
* Ctrl-C (SIGINT to the whole process group, as a terminal sends it): where to resume, exit
  status 130, the stores' locks free.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from daskhps.runfiles.checkpoint import latest_checkpoint
from daskhps.tiers.lock import WriterLock
from daskhps.training.command import train_interrupted
from tests._logs import generated_logs
from tests._runs import cli_here, set_keys, tiny_config
from tests._signals import default_dispositions

NOISE = ("Traceback", "Compute Failed", "commit()", "still alive", "Errno")


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # day 1: 3000 rows = 6 passes of 500; day 2: the holdout
    return generated_logs(tmp_path_factory, days=2, rows_per_day=3000, parts_per_day=2, seed=3)


def _config(folder: Path, logs: Path, **over: Any) -> Path:
    d = tiny_config(
        folder / "run",
        logs,
        run={"name": "stops"},
        data={"holdout": {"day": "last"}},
        table={"expected_keys": 100_000},
        cluster={"n_workers": 2, "processes": True},
    )
    set_keys(d, over)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def _train(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daskhps.cli", "train", str(config), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _one_error_line(res: subprocess.CompletedProcess[str], *words: str) -> str:
    assert res.returncode == 1, res.stderr
    for noise in NOISE:
        assert noise not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("daskhps train: error")]
    assert len(errors) == 1, res.stderr
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("quiet", [True, False], ids=["quiet", "verbose"])
def test_a_bad_row_under_fail_is_one_line_without_dask_tracebacks(
    tmp_path: Path, logs: Path, quiet: bool
) -> None:
    bad = tmp_path / "logs"
    for f in logs.rglob("*"):
        if f.is_file():
            (bad / f.relative_to(logs)).parent.mkdir(parents=True, exist_ok=True)
            (bad / f.relative_to(logs)).write_bytes(f.read_bytes())
    part = sorted(bad.glob("day=*01/part-*"))[0]
    lines = part.read_text().splitlines(keepends=True)
    lines[4] = "garbage\tline\n"
    part.write_text("".join(lines))
    config = _config(tmp_path, bad, **{"data.bad_rows": "fail", "run.quiet": quiet})
    _one_error_line(_train(config), f"{part}: line 5", "expected 40 columns", "'skip'")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_store_folder_that_cannot_be_created_is_named_before_any_worker(
    tmp_path: Path,
    logs: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = _config(tmp_path, logs)
    train = ("train", str(config))
    res = cli_here(capfd, caplog, *train, "--set", "table.tiers.store_dir=/proc/daskhps-x")
    _one_error_line(res, "/proc/daskhps-x", "set table.tiers.store_dir to a writable folder")
    assert "dashboard" not in res.stderr and not (tmp_path / "run").exists()
    res = cli_here(capfd, caplog, *train, "--set", "run.dir=/proc/daskhps-x")
    _one_error_line(res, "cannot write the run to /proc/daskhps-x", "set run.dir to a writable")


def _ranks_unlocked(ckpt: Any) -> bool:
    try:
        for r in range(ckpt.num_workers):
            WriterLock(ckpt.store_path(r), f"store of rank {r}").acquire().release()
    except BlockingIOError:
        return False
    return True


@pytest.mark.slow
def test_ctrl_c_says_where_to_resume_and_frees_the_stores(tmp_path: Path, logs: Path) -> None:
    config = _config(tmp_path, logs, **{"passes.epochs": 50})  # far longer than the test
    run_dir = tmp_path / "run"
    err = (tmp_path / "stderr.txt").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "daskhps.cli", "train", str(config), "--set", "run.seed=2"],
        stdout=subprocess.DEVNULL,
        stderr=err,
        text=True,
        start_new_session=True,  # its own process group: SIGINT reaches it and its workers
        preexec_fn=default_dispositions,  # SIGINT heard, even when the suite runs in the background
    )
    try:
        deadline = time.monotonic() + 240
        while latest_checkpoint(run_dir) is None:  # a pass is done and checkpointed
            assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stderr = (tmp_path / "stderr.txt").read_text()
    for noise in NOISE:
        assert noise not in stderr, stderr
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None and ckpt.passes_done >= 1
    assert stderr.splitlines() == [
        f"daskhps train: interrupted: the run's last checkpoint is after pass "
        f"{ckpt.passes_done} ({ckpt.path}); resume with: daskhps train {config} "
        "--set run.seed=2 --resume"
    ]
    assert _ranks_unlocked(ckpt)  # the workers closed their stores, or are gone


def test_ctrl_c_before_any_checkpoint_says_nothing_was_checkpointed(
    tmp_path: Path, logs: Path
) -> None:
    config = _config(tmp_path, logs)
    args = argparse.Namespace(config=str(config), overrides=["table.dim=8"])
    assert train_interrupted(args) == (
        f"interrupted: nothing was checkpointed; start again with: daskhps train {config} "
        "--set table.dim=8"
    )
    args.overrides.append("checkpoint.every_passes=0")
    assert "nothing was checkpointed (checkpoint.every_passes is 0)" in train_interrupted(args)

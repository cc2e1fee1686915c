"""A run folder is its own: a copy of it trains without touching the original, a refused
resume changes nothing, a first attempt that fails leaves the folders as it found them, and a
resume of a finished run says so at once.

Each test drives the real command line in a subprocess (tests/_runs.py ``cli``) over real
stores on disk, and compares every file of the folders involved before and after
(``tree_digest``) or the probabilities every checkpoint predicts, bit for bit.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from daskhps.data.badrows import BadRowPolicy
from daskhps.data.parse import read_shard
from daskhps.data.schema import criteo_schema
from daskhps.errors import StoreNotFoundError
from daskhps.runfiles.checkpoint import MANIFEST, list_checkpoints
from daskhps.serve.score import CacheSizes, Scorer
from daskhps.serve.version import Servable
from daskhps.table import open_shard_store
from daskhps.training.inspection import describe
from tests._logs import generated_logs
from tests._runs import cli, tiny_config, write_config
from tests.runfiles.test_rundir import tree_digest

pytestmark = pytest.mark.slow

SMALL = CacheSizes(device_rows=4096, host_bytes=1 << 20)


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # day 1: 1500 rows = 3 passes of 500; day 2 is the holdout
    return generated_logs(tmp_path_factory, days=2, rows_per_day=1500, parts_per_day=2, seed=5)


def _frame(logs: Path) -> pd.DataFrame:
    part = sorted((logs / "day=2024-01-02").glob("part-*"))[0]
    frame, _ = read_shard(str(part), criteo_schema(), BadRowPolicy(action="skip"))
    return frame.iloc[:200]


def _predictions(run_dir: Path, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    out = {}
    for c in list_checkpoints(run_dir):
        scorer = Scorer(Servable.from_checkpoint(c), SMALL)
        try:
            out[c.name] = scorer.score(frame)
        finally:
            scorer.close()
    return out


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, logs: Path) -> Path:
    """A finished run of 2 epochs of 3 passes, the last 3 checkpoints kept: copied by each
    test."""
    root = tmp_path_factory.mktemp("trained")
    config = write_config(
        root / "run.yaml",
        tiny_config(
            root / "a",
            logs,
            data={"holdout": {"day": "last"}},
            passes={"epochs": 2},
            checkpoint={"keep": 3},
        ),
    )
    run = cli("train", str(config))
    assert run.returncode == 0, run.stderr[-3000:]
    return root


def _fresh(trained: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The trained run's folder and its config, as if trained at a place of this test's own
    (the paths its config and checkpoints record are rewritten to it)."""
    root = tmp_path / "runs"
    shutil.copytree(trained, root, symlinks=True)
    for path in [root / "run.yaml", *root.glob("a/config.yaml"), *root.glob("a/*/*/" + MANIFEST)]:
        path.write_text(path.read_text().replace(str(trained), str(root)))
    return root / "a", root / "run.yaml"


def test_a_copied_run_trains_in_its_own_stores(trained: Path, logs: Path, tmp_path: Path) -> None:
    a, config = _fresh(trained, tmp_path)
    frame = _frame(logs)
    before = _predictions(a, frame)
    digest = tree_digest(a)
    b = a.parent / "b"
    shutil.copytree(a, b, symlinks=True)  # cp -a runs/a runs/b
    # the checkpoints record where their stores are relative to themselves: b reads b's
    ckpt = list_checkpoints(b)[-1]
    assert ckpt.stores_dir == (b / "stores").absolute()
    run = cli(
        "train",
        str(config),
        "--set",
        f"run.dir={b}",
        "--resume",
        "--checkpoint",
        "pass-000005",
        "--overwrite",
        "--set",
        "table.optimizer.lr=0.2",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert tree_digest(a) == digest  # not one byte of the original changed
    assert _same(_predictions(a, frame), before)
    assert not describe(a, verify=True)["damaged"]
    after = _predictions(b, frame)
    assert np.array_equal(after["pass-000005"], before["pass-000005"])
    assert not np.array_equal(after["pass-000006"], before["pass-000006"])  # lr 0.2 trained
    for c in list_checkpoints(b):
        assert c.stores_dir == (b / "stores").absolute()
        assert not json.loads((c.path / MANIFEST).read_text())["stores_dir"].startswith("/")


def test_a_copy_made_before_relative_records_reads_its_own_stores(
    trained: Path, logs: Path, tmp_path: Path
) -> None:
    """Checkpoints that recorded an absolute stores_dir inside their run folder: a copy of
    the folder reads the copy's stores, and a resume there leaves the original alone."""
    a, config = _fresh(trained, tmp_path)
    for c in list_checkpoints(a):  # as checkpoints of earlier versions were written
        m = json.loads((c.path / MANIFEST).read_text())
        m["stores_dir"] = str((a / "stores").absolute())
        (c.path / MANIFEST).write_text(json.dumps(m, indent=1))
    digest = tree_digest(a)
    b = a.parent / "b"
    shutil.copytree(a, b, symlinks=True)
    assert list_checkpoints(b)[-1].stores_dir == (b / "stores").absolute()
    assert list_checkpoints(a)[-1].stores_dir == (a / "stores").absolute()
    run = cli("train", str(config), "--set", f"run.dir={b}", "--resume", "--set", "passes.epochs=3")
    assert run.returncode == 0, run.stderr[-3000:]
    assert tree_digest(a) == digest
    assert [c.name for c in list_checkpoints(b)][-1] == "pass-000009"


def test_stores_of_another_run_are_copied_or_refused(
    trained: Path, logs: Path, tmp_path: Path
) -> None:
    """Stores outside the run folder that another run trains in: a resume of a copy copies
    the checkpoint's rows into its own store_dir, or is refused in one line when the config
    names the other run's stores."""
    a, config = _fresh(trained, tmp_path)
    frame = _frame(logs)
    shared = tmp_path / "ssd" / "stores-a"
    shared.parent.mkdir()
    shutil.move(str(a / "stores"), shared)
    for c in list_checkpoints(a):  # a run whose store_dir was set outside its folder
        m = json.loads((c.path / MANIFEST).read_text())
        m["stores_dir"] = str(shared)
        m["config"]["table"]["tiers"]["store_dir"] = str(shared)
        (c.path / MANIFEST).write_text(json.dumps(m, indent=1))
    before = _predictions(a, frame)
    digest = tree_digest(a, shared)
    b = a.parent / "b"
    shutil.copytree(a, b, symlinks=True)
    refused = cli(
        "train",
        str(config),
        *("--set", f"run.dir={b}", "--set", f"table.tiers.store_dir={shared}"),
        *("--resume", "--set", "passes.epochs=3"),
    )
    assert refused.returncode != 0
    line = refused.stderr.strip().splitlines()[-1]
    assert str(a) in line and str(b) in line and "table.tiers.store_dir" in line, line
    assert "Traceback" not in refused.stderr
    assert tree_digest(a, shared) == digest
    run = cli(
        "train",
        str(config),
        *("--set", f"run.dir={b}", "--set", f"table.tiers.store_dir={b / 'stores'}"),
        *("--resume", "--set", "passes.epochs=3"),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert tree_digest(a, shared) == digest
    assert _same(_predictions(a, frame), before)
    newest = list_checkpoints(b)[-1]
    assert newest.name == "pass-000009" and newest.stores_dir == (b / "stores").absolute()


def test_inspect_verify_finds_a_commit_rewritten_by_another_run(
    trained: Path, tmp_path: Path
) -> None:
    """A store commit of a checkpoint's name written again later (as another run writing the
    same stores does) holds other rows: ``inspect --verify`` says the checkpoint's are not
    here (the run has no copy to read them from), and a resume refuses."""
    a, config = _fresh(trained, tmp_path)
    ckpt = list_checkpoints(a)[-1]
    with open_shard_store(ckpt.table_spec, ckpt.store_path(0), mode="a") as store:
        store.commit(ckpt.commit, {"checkpoint": ckpt.commit})  # the same name, a new commit
    shown = cli("inspect", str(a), "--verify")
    assert shown.returncode == 1
    line = shown.stderr.strip().splitlines()[-1]
    assert f"the store at {ckpt.store_path(0)} holds other rows" in line, shown.stderr
    with pytest.raises(StoreNotFoundError):
        describe(a)
    digest = tree_digest(a)
    resumed = cli("train", str(config), "--resume", "--set", "passes.epochs=3")
    assert resumed.returncode != 0
    assert "is not the one recorded" in resumed.stderr.strip().splitlines()[-1]
    assert tree_digest(a) == digest


def test_a_refused_resume_changes_nothing(trained: Path, tmp_path: Path) -> None:
    a, config = _fresh(trained, tmp_path)
    digest = tree_digest(a)
    t = time.monotonic()
    run = cli("train", str(config), "--resume", "--set", "passes.epochs=1")
    assert run.returncode != 0
    assert "passes.epochs" in run.stderr.strip().splitlines()[-1]
    run = cli(
        "train", str(config), "--resume", "--checkpoint", "pass-000004", "--set", "run.seed=9"
    )
    assert run.returncode != 0
    assert time.monotonic() - t < 60  # refused before any cluster starts
    assert tree_digest(a) == digest


def test_resume_of_a_finished_run_says_so_and_changes_nothing(
    trained: Path, tmp_path: Path
) -> None:
    a, config = _fresh(trained, tmp_path)
    digest = tree_digest(a)
    t = time.monotonic()
    run = cli("train", str(config), "--resume")
    seconds = time.monotonic() - t
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [x for x in run.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "is complete" in lines[0], run.stderr
    assert "--set passes.epochs=3" in lines[0]
    assert seconds < 30, seconds  # no cluster: an interpreter's start and a few reads
    assert tree_digest(a) == digest


def test_a_failed_first_attempt_leaves_the_folder_as_it_found_it(
    logs: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "logs"
    shutil.copytree(logs, bad)
    part = sorted((bad / "day=2024-01-01").glob("part-*"))[0]
    with part.open("a") as f:
        f.write("not\ta\trow\n")
    config = write_config(
        tmp_path / "run.yaml",
        tiny_config(tmp_path / "runs" / "c", bad, data={"bad_rows": "fail"}),
    )
    (tmp_path / "runs").mkdir()
    first = cli("train", str(config))
    assert first.returncode != 0
    assert part.name in first.stderr.strip().splitlines()[-1]
    assert list((tmp_path / "runs").iterdir()) == []  # no run folder, no stores
    again = cli("train", str(config))  # the same command: the same error, not "holds a run"
    assert again.returncode != 0
    assert "already holds a run" not in again.stderr
    assert part.name in again.stderr.strip().splitlines()[-1]

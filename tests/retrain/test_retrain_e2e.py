"""Scheduled retraining end to end: real generated day partitions, real training on a
LocalCluster (1 worker, gloo), real zarr stores, the command line's exit codes. The killed run
starts its own cluster, as a scheduled job would; the runs in this process use the session's
warm shared cluster of the same shape (tests/_clusters.py).

One scenario, day by day (each step depends on the previous, so it is one test):

1. 01-01, 01-02 complete, 01-03 still being written -> a first run is SIGKILLed once its
   candidate's checkpoint is complete, before publishing: nothing is published, the lock is
   free; the next run trains 01-01 from scratch, scores 01-02, publishes v000001 (the
   incomplete day is ignored);
2. again, nothing new -> exit 3, nothing trained;
3. 01-03 completes, impossible guard -> the candidate (trained on 01-02 from v000001, scored
   on 01-03) is rejected: exit 4, v000001 stays current, the reason is printed;
4. 01-04 arrives -> train 01-02 and 01-03 from v000001, score 01-04, publish v000002; the
   rows of v000001 are untouched by the candidates that branched from it;
5. list, roll back to v000001, roll back to an unknown version, nothing new again.

Then the same days read from a bucket of an S3 server on 127.0.0.1 (tests/_s3.py): publish,
a day being written is nothing new, its _SUCCESS arrives and the next run trains on it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from daskhps.cli import main
from daskhps.config import load_config
from daskhps.data.source import SUCCESS
from daskhps.retrain import ExitCode, Registry
from daskhps.runfiles.checkpoint import load_checkpoint
from tests._clusters import SharedClusters
from tests._logs import generated_logs
from tests._runs import tiny_config
from tests.runfiles.test_rundir import tree_digest

pytestmark = pytest.mark.slow

DAYS = ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04"]


@pytest.fixture(scope="module")
def all_days(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logs(
        tmp_path_factory, days=4, rows_per_day=2000, parts_per_day=2, seed=5, name="all-days"
    )


def _arrive(all_days: Path, logs: Path, day: str, complete: bool = True) -> None:
    """Copy one day's parts into the live log folder; its marker only when complete."""
    src, dst = all_days / f"day={day}", logs / f"day={day}"
    dst.mkdir(parents=True, exist_ok=True)
    for part in sorted(src.glob("part-*")):
        shutil.copyfile(part, dst / part.name)
    if complete:
        (dst / SUCCESS).write_text("")


def _config(tmp: Path, logs: Path, cluster: dict[str, Any] | None = None) -> Path:
    """The retraining config; ``cluster``: its section (default: its own LocalCluster)."""
    d = tiny_config(
        tmp / "run",
        logs,
        run={"name": "rt"},
        data={"train": {"require_complete": True}},
        passes={"examples_per_pass": 2000, "global_batch_size": 200},
        table={"tiers": {"device": {"rows": 50_000}}},
        cluster_section=cluster,  # None: tiny_config's own LocalCluster
        eval={"every_pass": False},
        # Tiny days make noisy AUCs: a loose guard, so the publishing steps publish.
        retrain={"max_auc_drop": 0.05, "max_logloss_rise": 0.05},
    )
    path = tmp / ("retrain.yaml" if cluster is None else "retrain-shared.yaml")
    path.write_text(yaml.safe_dump(d))
    return path


def _committed_rows(version_dir: Path) -> dict[int, list[float]]:
    ckpt = load_checkpoint(version_dir)
    out: dict[int, list[float]] = {}
    for rank in range(ckpt.num_workers):
        with ckpt.open_store(rank) as store:
            keys = store.keys()
            rows = store.lookup(keys).rows
        out.update(zip(keys.tolist(), rows.tolist(), strict=True))
    return out


def test_a_few_days_of_retraining(
    all_days: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shared_clusters: SharedClusters,
) -> None:
    logs = tmp_path / "logs"
    own = _config(tmp_path, logs)  # the killed run's
    cfg = _config(tmp_path, logs, shared_clusters.section(workers=1, threads=2))
    registry = Registry(tmp_path / "run" / "versions")

    # 1. first run: two complete days, the third still being written
    _arrive(all_days, logs, DAYS[0])
    _arrive(all_days, logs, DAYS[1])
    _arrive(all_days, logs, DAYS[2], complete=False)
    killed = subprocess.run(
        [sys.executable, "-m", "daskhps.cli", "retrain", str(own)],
        env={**os.environ, "DASKHPS_KILL_AT": "after_checkpoint"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert registry.current() is None and not (registry.folder / "CURRENT").exists()
    assert registry.attempts() == []  # a killed run leaves no record: its days are retried
    assert main(["retrain", str(cfg)]) == ExitCode.PUBLISHED
    out = capsys.readouterr().out
    assert "published v000001" in out and "untrained model" in out
    v1 = registry.current()
    assert v1 is not None and v1.name == "v000001" and v1.parent is None
    assert v1.train_days == (DAYS[0],) and v1.eval_day == DAYS[1]
    assert v1.metrics["auc"] > v1.baseline["auc"]  # training beat the untrained model
    assert v1.metrics["examples"] == v1.baseline["examples"] == 2000  # the same rows
    ckpt1 = load_checkpoint(v1.checkpoint)
    assert ckpt1.commit == "version-v000001" and ckpt1.days == [DAYS[0]]
    rows_v1 = _committed_rows(Path(v1.checkpoint))
    assert rows_v1

    # 2. nothing new: nothing trained, nothing recorded
    attempts = len(registry.attempts())
    assert main(["retrain", str(cfg)]) == ExitCode.NOTHING_NEW
    assert "no new complete day" in capsys.readouterr().out
    assert len(registry.attempts()) == attempts == 1
    assert len(list((tmp_path / "run" / "attempts").iterdir())) == 2  # the killed one's too

    # 3. the third day completes; a config a warm start refuses changes nothing
    (logs / f"day={DAYS[2]}" / SUCCESS).write_text("")
    before = tree_digest(tmp_path / "run")
    assert main(["retrain", str(cfg), "--set", "table.dim=8"]) == ExitCode.BAD_CONFIG
    assert "table.dim" in capsys.readouterr().err
    assert tree_digest(tmp_path / "run") == before  # no attempt recorded, no folder made
    # ... and a guard no candidate can pass
    code = main(["retrain", str(cfg), "--set", "retrain.min_auc=1.0"])
    out = capsys.readouterr().out
    assert code == ExitCode.REJECTED
    assert "candidate rejected" in out and "< min_auc 1.0" in out and "v000001 stays current" in out
    assert registry.current() == v1
    rejected = registry.attempts()[-1]
    assert rejected.outcome == "rejected" and rejected.base == "v000001"
    assert rejected.train_days == (DAYS[1],) and rejected.eval_day == DAYS[2]
    # the baseline is the published model, scored on the same rows as the candidate
    assert rejected.baseline["examples"] == rejected.metrics["examples"] == 2000
    assert rejected.baseline["auc"] != rejected.metrics["auc"]

    # 4. a new day: train on the rejected day too, from v000001, and publish
    _arrive(all_days, logs, DAYS[3])
    assert main(["retrain", str(cfg)]) == ExitCode.PUBLISHED
    assert "published v000002" in capsys.readouterr().out
    v2 = registry.current()
    assert v2 is not None and v2.name == "v000002" and v2.parent == "v000001"
    assert v2.train_days == (DAYS[1], DAYS[2]) and v2.eval_day == DAYS[3]
    assert v2.stores_dir == v1.stores_dir  # one set of append-only stores, no copy
    rows_v2 = _committed_rows(Path(v2.checkpoint))
    assert rows_v2 != rows_v1
    # v000001's commit still reads exactly its rows, after two candidates wrote after it
    assert _committed_rows(Path(v1.checkpoint)) == rows_v1
    # the warm start carried the dense model over: v2's baseline is v1 scored on 01-04
    attempt_v2 = registry.attempts()[-1]
    assert attempt_v2.version == "v000002" and attempt_v2.base == "v000001"
    ckpt2 = load_checkpoint(v2.checkpoint)
    assert not all(
        torch.equal(a, b)
        for a, b in zip(ckpt1.dense_state().values(), ckpt2.dense_state().values(), strict=True)
    )

    # 5. list, roll back, refuse an unknown version, nothing new
    assert main(["retrain", str(cfg), "--versions"]) == ExitCode.PUBLISHED
    listing = capsys.readouterr().out
    assert "*  v000002" in listing and "   v000001" in listing and "min_auc 1.0" in listing
    assert main(["retrain", str(cfg), "--rollback", "v000001"]) == ExitCode.PUBLISHED
    assert "CURRENT is now v000001 (was v000002)" in capsys.readouterr().out
    assert (tmp_path / "run" / "versions" / "CURRENT").read_text() == "v000001\n"
    assert main(["retrain", str(cfg), "--rollback", "v000009"]) == ExitCode.BAD_CONFIG
    assert "no version 'v000009'" in capsys.readouterr().err
    assert registry.current() == v1
    assert main(["retrain", str(cfg)]) == ExitCode.NOTHING_NEW
    events = json.loads((tmp_path / "run" / "versions" / "registry.json").read_text())["events"]
    assert [e["action"] for e in events] == ["publish", "publish", "rollback"]
    # a copy of the retraining folder reads its own versions and stores, not the original's
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "run", copy, symlinks=True)
    for v in Registry(copy / "versions").versions():
        assert Path(v.checkpoint).is_relative_to(copy) and Path(v.stores_dir).is_relative_to(copy)
        assert load_checkpoint(v.checkpoint).stores_dir.is_relative_to(copy)
        assert _committed_rows(Path(v.checkpoint)) == _committed_rows(
            tmp_path / "run" / "versions" / v.name
        )
    # the resolved config of every attempt is a valid run config on its own
    for attempt_dir in (tmp_path / "run" / "attempts").iterdir():
        load_config(attempt_dir / "config.yaml")


def _arrive_in_bucket(
    server: Any, all_days: Path, url: str, day: str, complete: bool = True
) -> None:
    """Upload one day's parts to the bucket's log folder; its marker last, when complete."""
    fs, folder = server.fs(), f"{url.split('://', 1)[1]}/day={day}"
    for part in sorted((all_days / f"day={day}").glob("part-*")):
        fs.put_file(str(part), f"{folder}/{part.name}")
    if complete:
        fs.pipe_file(f"{folder}/{SUCCESS}", b"")


def test_retraining_from_day_folders_in_a_bucket(
    all_days: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shared_clusters: SharedClusters,
) -> None:
    """``data.train.paths`` a bucket's folder of ``day=`` folders, reached through the
    config's ``storage.options`` (here and on the workers): the first run publishes from the
    days there, the next trains the day that arrived since and scores the newest."""
    from daskhps import storage
    from tests._s3 import s3_server

    registry = Registry(tmp_path / "run" / "versions")
    with s3_server() as server:
        url = server.bucket("clicks") + "/logs"
        for day in DAYS[:2]:
            _arrive_in_bucket(server, all_days, url, day)
        cluster = shared_clusters.section(workers=1, threads=2)
        path = _config(tmp_path, url, cluster)  # type: ignore[arg-type]  # a URL, not a Path
        cfg = yaml.safe_load(path.read_text())
        path.write_text(yaml.safe_dump({**cfg, "storage": {"options": server.options}}))
        try:
            assert main(["retrain", str(path)]) == ExitCode.PUBLISHED
            assert "published v000001" in capsys.readouterr().out
            v1 = registry.current()
            assert v1 is not None and (v1.train_days, v1.eval_day) == ((DAYS[0],), DAYS[1])

            _arrive_in_bucket(server, all_days, url, DAYS[2], complete=False)  # being written
            assert main(["retrain", str(path)]) == ExitCode.NOTHING_NEW
            _arrive_in_bucket(server, all_days, url, DAYS[2])  # its _SUCCESS, last
            assert main(["retrain", str(path)]) == ExitCode.PUBLISHED, capsys.readouterr().err
            assert "published v000002" in capsys.readouterr().out
        finally:
            storage.use_options({"s3": {}})
    attempt = registry.attempts()[-1]
    assert (attempt.base, attempt.train_days, attempt.eval_day) == ("v000001", (DAYS[1],), DAYS[2])
    assert attempt.metrics["examples"] == attempt.baseline["examples"] == 2000  # all of 01-03
    v2 = registry.current()
    assert v2 is not None and v2.name == attempt.version == "v000002"
    assert (v2.parent, v2.train_days, v2.eval_day) == ("v000001", (DAYS[1],), DAYS[2])

"""The version registry, the run lock and the publish guard, without a cluster."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from pathlib import Path

import pytest

from daskhps.config.retrain import RetrainConfig
from daskhps.retrain import (
    Attempt,
    Registry,
    RegistryError,
    RetrainLock,
    RetrainLockedError,
    Version,
    VersionNotFoundError,
    judge,
)
from daskhps.retrain.versions import published_checkpoint


def _version(
    name: str, through: str, eval_day: str, parent: str | None = None, root: str = "/data/rt"
) -> Version:
    """A version whose folders are under ``root`` (absolute: outside the registry's run
    folder they are recorded as they are)."""
    return Version(
        name=name,
        checkpoint=f"{root}/versions/{name}",
        commit=f"commit-{name}",
        stores_dir=f"{root}/stores/a-{name}",
        parent=parent,
        train_days=(through,),
        trained_through=through,
        eval_day=eval_day,
        metrics={"auc": 0.7, "logloss": 0.5},
        baseline={"auc": 0.69, "logloss": 0.51},
        created=1.0,
    )


def _attempt(version: Version | None, eval_day: str, outcome: str = "published") -> Attempt:
    return Attempt(
        id=f"a-{eval_day}",
        base=version.parent if version else None,
        train_days=version.train_days if version else ("2024-01-01",),
        eval_day=eval_day,
        outcome=outcome,  # type: ignore[arg-type]
        version=version.name if version and outcome == "published" else None,
        reasons=("AUC fine",),
    )


def test_empty_registry(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "versions")
    assert reg.current() is None and reg.versions() == [] and reg.seen_through() is None
    assert reg.next_name() == "v000001"
    assert not (tmp_path / "versions").exists()  # reading never writes


def test_publish_history_and_rollback(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "versions")
    v1 = _version("v000001", "2024-01-02", "2024-01-03")
    reg.publish(v1, _attempt(v1, "2024-01-03"))
    assert reg.current() == v1 and reg.next_name() == "v000002"
    assert (tmp_path / "versions" / "CURRENT").read_text() == "v000001\n"
    reg.record(_attempt(None, "2024-01-04", "rejected"))
    assert reg.current() == v1 and reg.seen_through() == "2024-01-04"
    v2 = _version("v000002", "2024-01-04", "2024-01-05", parent="v000001")
    reg.publish(v2, _attempt(v2, "2024-01-05"))
    assert reg.current() == v2 and [v.name for v in reg.versions()] == ["v000001", "v000002"]
    assert [a.outcome for a in reg.attempts()] == ["published", "rejected", "published"]

    previous, now = reg.rollback("v000001")
    assert previous == v2 and now == v1 and reg.current() == v1
    assert (tmp_path / "versions" / "CURRENT").read_text() == "v000001\n"
    assert [(e["action"], e["version"], e["from"]) for e in reg.events()] == [
        ("publish", "v000001", None),
        ("publish", "v000002", "v000001"),
        ("rollback", "v000001", "v000002"),
    ]
    # A fresh reader sees the same state: nothing is cached in memory.
    assert Registry(tmp_path / "versions").current() == v1
    assert not list((tmp_path / "versions").glob(".*tmp*"))  # no temporary files left


def test_paths_inside_the_retraining_folder_are_recorded_relative(tmp_path: Path) -> None:
    """A copied or moved retraining folder reads its own versions: registry.json records
    the paths inside the folder relative to ``versions/``, and they read back absolute."""
    run = tmp_path / "rt"
    reg = Registry(run / "versions")
    v1 = _version("v000001", "2024-01-02", "2024-01-03", root=str(run))
    (run / "versions" / "v000001").mkdir(parents=True)
    (run / "stores" / "a-v000001").mkdir(parents=True)
    reg.publish(v1, _attempt(v1, "2024-01-03"))
    assert reg.current() == v1
    (recorded,) = json.loads((run / "versions" / "registry.json").read_text())["versions"]
    assert recorded["checkpoint"] == "v000001"
    assert recorded["stores_dir"] == "../stores/a-v000001"
    shutil.copytree(run, tmp_path / "copy")
    copied = Registry(tmp_path / "copy" / "versions").current()
    assert copied is not None
    assert copied.checkpoint == str(tmp_path / "copy" / "versions" / "v000001")
    assert copied.stores_dir == str(tmp_path / "copy" / "stores" / "a-v000001")
    # a registry written before (absolute paths): a copy reads its own where it has them
    data = json.loads((run / "versions" / "registry.json").read_text())
    data["versions"][0].update(checkpoint=v1.checkpoint, stores_dir=v1.stores_dir)
    (tmp_path / "copy" / "versions" / "registry.json").write_text(json.dumps(data))
    legacy = Registry(tmp_path / "copy" / "versions").current()
    assert legacy is not None and legacy.checkpoint == copied.checkpoint
    assert legacy.stores_dir == copied.stores_dir
    assert Registry(run / "versions").current() == v1  # the original as it was


def test_failed_attempts_do_not_count_as_seen(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    reg.record(_attempt(None, "2024-01-03", "failed"))
    assert reg.seen_through() is None


def test_unknown_version(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    v1 = _version("v000001", "2024-01-02", "2024-01-03")
    reg.publish(v1, _attempt(v1, "2024-01-03"))
    with pytest.raises(VersionNotFoundError, match=r"no version 'v9'.*published versions: v000001"):
        reg.rollback("v9")
    assert reg.current() == v1
    with pytest.raises(RegistryError, match="already holds"):
        reg.publish(v1, _attempt(v1, "2024-01-03"))


def test_damaged_registry_is_reported_not_overwritten(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    v1 = _version("v000001", "2024-01-02", "2024-01-03")
    reg.publish(v1, _attempt(v1, "2024-01-03"))
    good = reg.path.read_text()
    reg.path.write_text(good[: len(good) // 2])  # torn by hand, as a bad copy would
    with pytest.raises(RegistryError, match=r"registry\.json is unreadable.*backup"):
        reg.current()
    v2 = _version("v000002", "2024-01-03", "2024-01-04")
    with pytest.raises(RegistryError):
        reg.publish(v2, _attempt(v2, "2024-01-04"))
    assert reg.path.read_text() == good[: len(good) // 2]  # left for the user to restore

    reg.path.write_text(json.dumps({"format": 99, "versions": [], "attempts": [], "events": []}))
    with pytest.raises(RegistryError, match="format 99"):
        reg.versions()


def test_current_naming_an_unknown_version(tmp_path: Path) -> None:
    reg = Registry(tmp_path)
    (tmp_path / "CURRENT").write_text("v000007\n")
    with pytest.raises(RegistryError, match=r"names version 'v000007'.*--rollback"):
        reg.current()


def _try_lock(run_dir: str, queue: multiprocessing.Queue) -> None:
    try:
        RetrainLock(run_dir).acquire()
        queue.put("acquired")
    except RetrainLockedError as e:
        queue.put(str(e))


def test_lock_refuses_a_second_run(tmp_path: Path) -> None:
    with RetrainLock(tmp_path) as held:
        assert held.held
        with pytest.raises(RetrainLockedError, match=rf"pid {os.getpid()}.*wait"):
            RetrainLock(tmp_path).acquire()
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        proc = ctx.Process(target=_try_lock, args=(str(tmp_path), queue))
        proc.start()
        proc.join(60)
        assert "another retraining run holds" in queue.get(timeout=5)
    assert not held.held
    with RetrainLock(tmp_path):  # released: the next run gets it
        pass


def test_guard() -> None:
    base = {"auc": 0.70, "logloss": 0.50}
    guard = RetrainConfig(max_auc_drop=0.002, max_logloss_rise=0.01, min_auc=0.6)
    ok = judge({"auc": 0.699, "logloss": 0.505}, base, guard)
    assert ok.publish and len(ok.passed) == 3 and not ok.failed
    worse = judge({"auc": 0.69, "logloss": 0.52}, base, guard)
    assert not worse.publish and len(worse.failed) == 2
    assert "drop +0.01000 > max_auc_drop 0.002" in worse.explain()
    assert "rise +0.02000 > max_logloss_rise 0.01" in worse.explain()
    low = judge({"auc": 0.55, "logloss": 0.4}, {"auc": 0.5, "logloss": 0.7}, guard)
    assert not low.publish and low.failed == ("AUC 0.55000 < min_auc 0.6",)


def test_guard_rejects_a_broken_candidate() -> None:
    nan = float("nan")
    v = judge({"auc": nan, "logloss": nan}, {"auc": 0.7, "logloss": 0.5}, RetrainConfig())
    assert not v.publish and "diverged" in v.explain() and "AUC undefined" in v.explain()
    # an impossible threshold fails whatever the candidate
    v = judge({"auc": 0.99, "logloss": 0.1}, None, RetrainConfig(min_auc=1.0))
    assert not v.publish


def test_guard_checks_can_be_switched_off() -> None:
    off = RetrainConfig(max_auc_drop=None, max_logloss_rise=None, min_auc=None)
    v = judge({"auc": 0.1, "logloss": 0.9}, {"auc": 0.9, "logloss": 0.1}, off)
    assert v.publish and v.explain() == "no checks enabled"


def test_published_checkpoint_of_a_run_directory(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "run" / "versions")
    assert published_checkpoint(tmp_path / "run") is None  # not a retraining run (yet)
    reg.record(_attempt(None, "2024-01-03", "rejected"))
    with pytest.raises(VersionNotFoundError, match="no published version yet"):
        published_checkpoint(tmp_path / "run")
    v1 = _version("v000001", "2024-01-02", "2024-01-03")
    reg.publish(v1, _attempt(v1, "2024-01-03"))
    assert published_checkpoint(tmp_path / "run") == Path(v1.checkpoint)
    assert published_checkpoint(tmp_path / "run" / "versions") == Path(v1.checkpoint)

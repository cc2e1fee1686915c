"""The run-directory rules on real folders and real zarr stores (no cluster): what counts as an
earlier run, moving it aside and back, settling an interrupted ``--overwrite``, and refusing
folders that hold published versions."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

from daskhps.errors import ConfigError, RunExistsError
from daskhps.retrain.versions import Attempt, Registry
from daskhps.runfiles import rundir
from daskhps.runfiles.writing import finish_checkpoint, start_checkpoint, write_payload
from daskhps.table import OptimizerSpec, TableSpec, open_shard_store


def tree_digest(*roots: Path) -> str:
    """Every file under ``roots``: path, size and content; any change shows."""
    h = hashlib.sha256()
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                h.update(f"{p.relative_to(root.parent)}:{p.stat().st_size}".encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def _store(path: Path, commit: str) -> None:
    spec = TableSpec("t", 2, OptimizerSpec(kind="sgd", lr=0.1))
    with open_shard_store(spec, path / "t" / "rank-0", mode="w") as s:
        s.upsert(torch.arange(5, dtype=torch.int64), torch.ones(5, spec.width))
        s.commit(commit)


def _checkpoint(run_dir: Path, *, complete: bool) -> None:
    """Checkpoint pass-000001 as the checkpointer writes it; without its manifest (torn)
    unless ``complete``."""
    folder = start_checkpoint(run_dir, "pass-000001")
    files = write_payload(folder, model={}, optimizer={}, rng=[], state={"passes_done": 1})
    if complete:
        fields = {"kind": "base", "passes_done": 1, "step": 1, "commit": "pass-000001"}
        fields |= {"stores_dir": str(run_dir / "stores"), "num_workers": 1, "num_shards": 1}
        finish_checkpoint(folder, files, {**fields, "table": {}, "config": {}})


def _earlier_run(run_dir: Path, *, complete: bool = False) -> Path:
    """A run folder as training leaves it (a checkpoint folder, metrics, stores)."""
    stores = run_dir / "stores"
    _store(stores, "pass-000001")
    _checkpoint(run_dir, complete=complete)
    (run_dir / "metrics.jsonl").write_text('{"pass": 1}\n')
    (run_dir / "config.yaml").write_text("run: {name: x}\n")
    (run_dir / "report").mkdir()
    (run_dir / "report" / "report.html").write_text("<html/>")
    return stores


def test_an_empty_or_config_only_folder_holds_no_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert rundir.find_earlier_run(run, run / "stores") is None
    run.mkdir()
    (run / "config.yaml").write_text("run: {}\n")
    (run / "metrics.jsonl").write_text("")
    (run / "stores").mkdir()
    assert rundir.find_earlier_run(run, run / "stores") is None


@pytest.mark.parametrize("what", ["checkpoint", "metrics", "summary", "stores", "resharded"])
def test_each_trace_of_training_counts_as_a_run(tmp_path: Path, what: str) -> None:
    run, stores = tmp_path / "run", tmp_path / "run" / "stores"
    run.mkdir()
    if what == "checkpoint":
        (run / "checkpoints" / "pass-000003").mkdir(parents=True)  # torn: still a run's
    elif what == "metrics":
        (run / "metrics.jsonl").write_text("{}\n")
    elif what == "summary":
        (run / "summary.json").write_text("{}")
    elif what == "stores":
        _store(stores, "pass-000001")
    else:
        _store(run / "stores-resharded-pass-000001-w2", "pass-000001")
    found = rundir.find_earlier_run(run, stores)
    assert found is not None
    assert "no complete checkpoint" in found.describe() or what != "checkpoint"


def test_moved_aside_then_restored_is_unchanged(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stores = _earlier_run(run)
    before = tree_digest(run)
    earlier = rundir.find_earlier_run(run, stores)
    assert earlier is not None
    moved = rundir.move_aside(earlier, None, "cfg.yaml")
    assert rundir.find_earlier_run(run, stores) is None  # the new run starts empty
    # the new run writes its own files in the same places, then fails
    (run / "config.yaml").write_text("run: {name: new}\n")
    (run / "checkpoints" / "pass-000001").mkdir(parents=True)
    _store(stores, "pass-000001")
    moved.restore()
    assert tree_digest(run) == before
    assert not (run / rundir.ASIDE).exists()


def test_discard_deletes_only_the_earlier_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stores = _earlier_run(run)
    earlier = rundir.find_earlier_run(run, stores)
    assert earlier is not None
    moved = rundir.move_aside(earlier, None, "cfg.yaml")
    (run / "metrics.jsonl").write_text('{"pass": 1, "new": true}\n')
    moved.discard()
    assert sorted(os.listdir(run)) == ["metrics.jsonl"]
    assert "new" in (run / "metrics.jsonl").read_text()


def test_stores_elsewhere_are_moved_beside_themselves(tmp_path: Path) -> None:
    run, stores = tmp_path / "run", tmp_path / "ssd" / "stores"
    run.mkdir()
    _store(stores, "pass-000001")
    before = tree_digest(stores)
    earlier = rundir.find_earlier_run(run, stores)
    assert earlier is not None
    moved = rundir.move_aside(earlier, None, "cfg.yaml")
    assert not stores.exists() and (tmp_path / "ssd" / f".stores{rundir.ASIDE}").is_dir()
    moved.restore()
    assert tree_digest(stores) == before


@pytest.mark.parametrize("new_run_checkpointed", [False, True])
def test_an_interrupted_overwrite_is_settled_by_the_next_train(
    tmp_path: Path, new_run_checkpointed: bool
) -> None:
    """A kill between moving aside and the first checkpoint: the earlier run comes back; a kill
    after the first checkpoint but before the deletion: the deletion is finished."""
    run = tmp_path / "run"
    stores = _earlier_run(run, complete=True)
    before = tree_digest(run)
    earlier = rundir.find_earlier_run(run, stores)
    assert earlier is not None and earlier.complete == ["pass-000001"]
    rundir.move_aside(earlier, None, "cfg.yaml")  # ... and the process dies here
    _checkpoint(run, complete=new_run_checkpointed)  # the new run's
    rundir.settle_interrupted(run)
    assert not (run / rundir.ASIDE).exists()
    if new_run_checkpointed:
        assert not stores.exists() and not (run / "metrics.jsonl").exists()
    else:
        assert tree_digest(run) == before


@pytest.mark.parametrize("after_replaces", [0, 1, 2, 3, 5])
def test_ctrl_c_while_moving_aside_leaves_the_earlier_run_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after_replaces: int
) -> None:
    """Ctrl-C lands after ``after_replaces`` renames (the first writes the record): the
    caller never gets the moved run to restore, so moving aside puts it back itself."""
    run = tmp_path / "run"
    stores = _earlier_run(run, complete=True)
    before = tree_digest(run)
    earlier = rundir.find_earlier_run(run, stores)
    assert earlier is not None and len(earlier.paths) + 1 >= after_replaces
    replace, done, fired = os.replace, [], []

    def interrupted(src: object, dst: object) -> None:
        if len(done) == after_replaces and not fired:  # once: the undo renames too
            fired.append(True)
            raise KeyboardInterrupt
        replace(src, dst)  # type: ignore[arg-type]
        done.append(dst)

    monkeypatch.setattr(rundir.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rundir.move_aside(earlier, None, "cfg.yaml")
    monkeypatch.undo()
    assert fired  # the interrupt came where the case says
    assert tree_digest(run) == before
    assert not (run / rundir.ASIDE).exists()
    rundir.settle_interrupted(run)  # and the next train finds nothing to settle
    assert tree_digest(run) == before


def test_not_enough_disk_for_both_runs_refuses_before_moving(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stores = _earlier_run(run)
    before = tree_digest(run)
    earlier = rundir.find_earlier_run(run, stores)
    assert earlier is not None
    with pytest.raises(RunExistsError, match=r"disk cannot hold both.*MiB free"):
        rundir.move_aside(earlier, 1 << 60, "cfg.yaml")
    assert tree_digest(run) == before


@pytest.mark.parametrize("registry", ["versions", "."])
def test_a_retraining_folder_is_refused(tmp_path: Path, registry: str) -> None:
    run = tmp_path / "retrain"
    Registry(run / registry).record(Attempt("a1", None, ("2024-01-01",), "2024-01-02", "rejected"))
    with pytest.raises(RunExistsError, match=r"retraining folder.*daskhps retrain"):
        rundir.refuse_published(run, run / "stores", "retrain.yaml")


def test_stores_with_published_versions_are_refused(tmp_path: Path) -> None:
    stores = tmp_path / "shared"
    _store(stores, "version-v000001")
    assert rundir.published_commits(stores) == ["version-v000001"]
    with pytest.raises(RunExistsError, match=r"published versions \(version-v000001\)"):
        rundir.refuse_published(tmp_path / "run", stores, "cfg.yaml")
    _store(tmp_path / "other", "pass-000001")
    rundir.refuse_published(tmp_path / "run", tmp_path / "other", "cfg.yaml")  # no versions


def test_stores_may_not_hold_the_run_dir(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"holds run\.dir"):
        rundir.ensure_no_run_dir_clash(tmp_path / "a" / "run", tmp_path / "a")
    rundir.ensure_no_run_dir_clash(tmp_path / "run", tmp_path / "run" / "stores")

"""Freezing a checkpoint as a version: real zarr stores and a real checkpoint folder, no
cluster. The version's commit must survive later candidates that reuse the stores."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from daskhps.config import RunConfig
from daskhps.errors import CheckpointError
from daskhps.retrain import Attempt, Registry, Version, VersionNotFoundError
from daskhps.retrain.job import rollback
from daskhps.retrain.publish import commit_name, freeze_version
from daskhps.runfiles.checkpoint import load_checkpoint
from daskhps.runfiles.writing import finish_checkpoint, start_checkpoint, write_payload
from daskhps.table import open_shard_store
from daskhps.tiers.store import StoreReader

W = 2


def _store(cfg: RunConfig, stores: Path, rank: int, *, commit: str | None = None) -> StoreReader:
    spec = cfg.table_spec()
    return open_shard_store(spec, stores / spec.name / f"rank-{rank}", mode="a", commit=commit)


def _rows(cfg: RunConfig, stores: Path, rank: int, commit: str, keys: torch.Tensor) -> list:
    spec = cfg.table_spec()
    with open_shard_store(spec, stores / spec.name / f"rank-{rank}", mode="r", commit=commit) as s:
        return s.lookup(keys).rows.tolist()


def _train_like(cfg: RunConfig, stores: Path, run_dir: Path, value: float, base: str | None):
    """What a training run leaves: rows written at ``base``, commit pass-000001, checkpoint."""
    width = cfg.table_spec().width
    for r in range(W):
        with _store(cfg, stores, r, commit=base) as s:
            s.upsert(torch.tensor([r, 10 + r]), torch.full((2, width), value))
            s.commit("pass-000001", {})
    folder = start_checkpoint(run_dir, "pass-000001")
    model = {"w": torch.full((3,), value)}
    files = write_payload(folder, model=model, optimizer={"state": {}}, rng=[], state={})
    fields = {
        "kind": "base",
        "passes_done": 1,
        "step": 4,
        "commit": "pass-000001",
        "stores_dir": str(stores),
        "num_workers": W,
        "num_shards": 4,
        "table": cfg.table_spec().layout(),
        "config": cfg.to_dict(),
    }
    return finish_checkpoint(folder, files, fields)


@pytest.fixture
def cfg() -> RunConfig:
    return RunConfig.from_dict({"data": {"train": {"paths": "logs"}}, "table": {"dim": 4}})


def test_version_commit_survives_later_candidates(tmp_path: Path, cfg: RunConfig) -> None:
    stores = tmp_path / "stores"
    cand = _train_like(cfg, stores, tmp_path / "a1", 1.0, None)
    v1 = freeze_version(cand, tmp_path / "versions" / "v000001", "v000001")
    assert v1.commit == commit_name("v000001") == "version-v000001"
    assert v1.path == tmp_path / "versions" / "v000001" and v1.name == "v000001"
    assert load_checkpoint(v1.path).dense_state()["w"].tolist() == [1.0, 1.0, 1.0]
    assert v1.stores_dir == stores and v1.num_workers == W

    # A later candidate from v1 writes the same checkpoint and commit names into the stores.
    _train_like(cfg, stores, tmp_path / "a2", 2.0, v1.commit)
    keys, width = torch.tensor([0, 10]), cfg.table_spec().width
    assert _rows(cfg, stores, 0, "pass-000001", keys) == [[2.0] * width] * 2  # replaced
    assert _rows(cfg, stores, 0, v1.commit, keys) == [[1.0] * width] * 2  # the version's is not
    assert load_checkpoint(v1.path).dense_state()["w"].tolist() == [1.0, 1.0, 1.0]


def test_failed_copy_leaves_nothing_visible(
    tmp_path: Path, cfg: RunConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    cand = _train_like(cfg, tmp_path / "stores", tmp_path / "a1", 1.0, None)

    def full_disk(src: Path, dst: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("daskhps.retrain.publish._copy_durably", full_disk)
    folder = tmp_path / "versions" / "v000001"
    with pytest.raises(CheckpointError, match=r"No space left.*nothing was published"):
        freeze_version(cand, folder, "v000001")
    assert not folder.exists()
    with pytest.raises(CheckpointError):
        load_checkpoint(folder)


def _publish(reg: Registry, ckpt_path: Path, name: str, parent: str | None) -> Version:
    v = Version(name, str(ckpt_path), f"version-{name}", "stores", parent, ("d",), "d", "e")
    reg.publish(v, Attempt(f"a-{name}", parent, ("d",), "e", "published", name))
    return v


def test_rollback_checks_the_version_is_still_there(tmp_path: Path, cfg: RunConfig) -> None:
    import dataclasses

    run = dataclasses.replace(cfg, run=cfg.run.replace(dir=str(tmp_path / "run")))
    stores, reg = tmp_path / "stores", Registry(tmp_path / "run" / "versions")
    v1 = freeze_version(
        _train_like(cfg, stores, tmp_path / "a1", 1.0, None), reg.folder / "v000001", "v000001"
    )
    _publish(reg, v1.path, "v000001", None)
    v2 = freeze_version(
        _train_like(cfg, stores, tmp_path / "a2", 2.0, v1.commit), reg.folder / "v000002", "v000002"
    )
    _publish(reg, v2.path, "v000002", "v000001")

    out = rollback(run, "v000001")
    assert out.code == 0 and "CURRENT is now v000001 (was v000002)" in out.message
    assert [v.name for v in reg.versions()] == ["v000001", "v000002"]
    assert (reg.folder / "CURRENT").read_text() == "v000001\n"

    # v000002's commit disappears from one rank store (dropped by hand): refuse, keep CURRENT
    for manifest in (stores / cfg.table.name / "rank-1" / "commits").glob("*.json"):
        if '"version-v000002"' in manifest.read_text():
            manifest.unlink()
    with pytest.raises(
        VersionNotFoundError, match=r"commit 'version-v000002' is gone from .*rank-1"
    ):
        rollback(run, "v000002")
    assert (reg.folder / "CURRENT").read_text() == "v000001\n"

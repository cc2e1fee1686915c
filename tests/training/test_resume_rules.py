"""Resume without a cluster: which config changes a resume accepts, the plan check, the
metrics file, and re-sharding real zarr stores to another worker count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from daskhps.config import RunConfig
from daskhps.errors import ResumeError
from daskhps.runfiles import writing
from daskhps.runfiles.checkpoint import Checkpoint, checkpoint_name
from daskhps.sharding import ShardMap
from daskhps.table import EmbeddingTable
from daskhps.training.resume import (
    check_plan,
    check_resume,
    plan_fingerprint,
    reshard,
    restore_metrics,
)


def _config(run_dir: Path, **over: Any) -> RunConfig:
    d: dict[str, Any] = {
        "run": {"name": "r", "dir": str(run_dir)},
        "data": {"train": {"paths": "logs"}},
        "passes": {"examples_per_pass": 1000, "global_batch_size": 100, "num_shards": 12},
        "table": {"dim": 4, "optimizer": {"kind": "adagrad", "lr": 0.05}},
        "dense_optimizer": {"kind": "adam", "lr": 0.01},
        "cluster": {"n_workers": 1, "gpu": False},
    }
    for key, value in over.items():
        node = d
        *path, last = key.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
    return RunConfig.from_dict(d)


def _checkpoint(run_dir: Path, cfg: RunConfig, *, workers: int = 1, plan: Any = None) -> Checkpoint:
    folder = writing.start_checkpoint(run_dir, checkpoint_name(1))
    model = torch.nn.Linear(2, 1)
    files = writing.write_payload(
        folder, model=model.state_dict(), optimizer={}, rng=[], state={"step": 10}
    )
    return writing.finish_checkpoint(
        folder,
        files,
        {
            "kind": "base",
            "passes_done": 1,
            "step": 10,
            "commit": folder.name,
            "stores_dir": str(run_dir / "stores"),
            "num_workers": workers,
            "num_shards": cfg.passes.plan.num_shards,
            "table": cfg.table_spec().layout(),
            "config": cfg.to_dict(),
            "plan": plan,
        },
    )


def test_accepted_changes_are_returned(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, _config(tmp_path))
    new = _config(
        tmp_path,
        **{
            "dense_optimizer.lr": 0.02,
            "table.optimizer.lr": 0.1,
            "cluster.n_workers": 2,
            "eval.batch_size": 10,
            "passes.epochs": 3,
            "table.tiers.host.fraction": 0.1,
        },
    )
    changes = check_resume(ckpt, new)
    assert changes["dense_optimizer.lr"] == (0.01, 0.02)
    assert changes["cluster.n_workers"] == (1, 2)
    assert set(changes) >= {"table.optimizer.lr", "eval.batch_size", "passes.epochs"}
    assert check_resume(ckpt, _config(tmp_path)) == {}


@pytest.mark.parametrize(
    "key,value",
    [
        ("table.dim", 8),
        ("table.optimizer.kind", "sgd"),
        ("dense_optimizer.kind", "sgd"),
        ("table.seed", 5),
        ("passes.num_shards", 24),
        ("passes.global_batch_size", 50),
        ("data.train.paths", "other-logs"),
        ("model.options", {"bottom_mlp": [4]}),
    ],
)
def test_refused_changes_name_the_key_and_the_fix(tmp_path: Path, key: str, value: Any) -> None:
    ckpt = _checkpoint(tmp_path, _config(tmp_path))
    with pytest.raises(ResumeError, match=rf"{key}.*->.*start a new run") as e:
        check_resume(ckpt, _config(tmp_path, **{key: value}))
    assert str(ckpt.path) in str(e.value)


def test_changed_input_is_refused(tmp_path: Path) -> None:
    plan = plan_fingerprint(["a.tsv", "b.tsv"], [10, 20], 3)
    ckpt = _checkpoint(tmp_path, _config(tmp_path), plan=plan)
    check_plan(ckpt, plan_fingerprint(["a.tsv", "b.tsv"], [10, 20], 3))
    with pytest.raises(ResumeError, match="training input changed"):
        check_plan(ckpt, plan_fingerprint(["a.tsv", "b.tsv"], [10, 21], 3))


def test_metrics_after_the_checkpoint_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"pass": n}) + "\n" for n in range(1, 5)))
    assert restore_metrics(path, 2) == [{"pass": 1}, {"pass": 2}]  # passes 1 and 2 done
    assert path.read_text().splitlines() == ['{"pass": 1}', '{"pass": 2}']


@pytest.mark.parametrize("old,new", [(1, 3), (3, 2)])
def test_reshard_moves_every_row_to_its_new_owner(tmp_path: Path, old: int, new: int) -> None:
    cfg = _config(tmp_path)
    spec = cfg.table_spec()
    keys = torch.arange(5000, dtype=torch.int64) * 104729 - 7
    old_map = ShardMap(12, old)
    expected: dict[int, torch.Tensor] = {}
    for r in range(old):
        mine = keys[old_map.worker(keys) == r]
        with EmbeddingTable.open(
            spec, tmp_path / "stores" / spec.name / f"rank-{r}", device_rows=6000
        ) as t:
            t.stage(mine)
            t.apply_gradients(mine, torch.randn(len(mine), spec.dim))
            t.commit(checkpoint_name(1))
            t.apply_gradients(mine[:10], torch.randn(10, spec.dim))  # after the commit:
            t.commit("later")  # not part of the checkpoint
    for r in range(old):  # the rows as of the checkpoint's commit
        path = tmp_path / "stores" / spec.name / f"rank-{r}"
        with EmbeddingTable.open(
            spec, path, device_rows=10, mode="r", commit=checkpoint_name(1)
        ) as t:
            got = t.store.keys()
            expected.update(zip(got.tolist(), t.store.lookup(got).rows, strict=True))
    ckpt = _checkpoint(tmp_path, cfg, workers=old)
    out = reshard(ckpt, new, tmp_path / "resharded")
    new_map = ShardMap(12, new)
    seen = 0
    for r in range(new):
        with EmbeddingTable.open(
            spec, out / spec.name / f"rank-{r}", device_rows=10, mode="r", commit=ckpt.commit
        ) as t:
            got = t.store.keys()
            assert bool((new_map.worker(got) == r).all())
            rows = t.store.lookup(got).rows
            for k, row in zip(got.tolist(), rows, strict=True):
                assert torch.equal(row, expected[k])
            seen += len(got)
    assert seen == len(keys)


def test_kill_point_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from daskhps.errors import ConfigError
    from daskhps.training import killpoints

    monkeypatch.delenv(killpoints.ENV, raising=False)
    killpoints.check_env()
    assert not killpoints.armed_at("stage", 0)
    monkeypatch.setenv(killpoints.ENV, "checkpoint_commit:2")
    assert killpoints.armed_at("checkpoint_commit", 2)
    assert not killpoints.armed_at("checkpoint_commit", 1)
    assert not killpoints.armed_at("stage", 2)
    monkeypatch.setenv(killpoints.ENV, "mid_pass")  # no pass: the first time
    assert killpoints.armed_at("mid_pass", 0) and killpoints.armed_at("mid_pass", 5)
    for bad in ("staging", "stage:x"):
        monkeypatch.setenv(killpoints.ENV, bad)
        with pytest.raises(ConfigError, match=rf"DASKHPS_KILL_AT={bad!r}.*one of stage, mid_pass"):
            killpoints.check_env()


def test_pruning_drops_only_the_runs_own_old_commits() -> None:
    from daskhps.distributed.shards import droppable_commits

    names = ["pass-000001", "pass-000002", "pass-000003", "pass-000004"]
    assert droppable_commits(names, "pass-000003", "pass-") == 2
    assert droppable_commits(names, "pass-000001", "pass-") == 0
    # a published version's commit in shared stores is never dropped, nor anything after it
    shared = ["pass-000001", "version-v000001", "pass-000002", "pass-000003"]
    assert droppable_commits(shared, "pass-000003", "pass-") == 1
    assert droppable_commits(shared, "pass-000003") == 3  # no prefix: everything older
    # commits after the oldest kept checkpoint's stay (a torn one, replaced when its pass is
    # committed again)
    assert droppable_commits(names[:3], "pass-000002", "pass-") == 1


def test_reshard_never_replaces_stores_holding_a_published_version(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    spec = cfg.table_spec()
    keys = torch.arange(100, dtype=torch.int64)
    with EmbeddingTable.open(
        spec, tmp_path / "stores" / spec.name / "rank-0", device_rows=200
    ) as t:
        t.stage(keys)
        t.commit(checkpoint_name(1))
    ckpt = _checkpoint(tmp_path, cfg, workers=1)
    out = tmp_path / "resharded"
    with EmbeddingTable.open(spec, out / spec.name / "rank-0", device_rows=200) as t:
        t.stage(keys[:10])
        t.commit("version-v000001")
    before = sorted((p.relative_to(out), p.stat().st_size) for p in out.rglob("*") if p.is_file())
    with pytest.raises(ResumeError, match=r"published versions \(version-v000001\)"):
        reshard(ckpt, 2, out)
    after = sorted((p.relative_to(out), p.stat().st_size) for p in out.rglob("*") if p.is_file())
    assert after == before

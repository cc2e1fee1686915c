"""Re-sharding on the workers (daskhps.distributed.reshard) against the driver's re-shard
(daskhps.training.resume.reshard) as the model, on a real LocalCluster of four worker
processes: every new rank store holds the same keys, rows (bit for bit), pending counts and
commit; no store is opened by the driver; the bytes over the network are the rows that change
worker plus what the report says it adds to them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from daskhps.config import RunConfig
from daskhps.distributed import ReshardReport, reshard_on_workers, start_cluster
from daskhps.distributed.cluster import ClusterHandle
from daskhps.errors import ResumeError
from daskhps.runfiles.checkpoint import Checkpoint, latest_checkpoint
from daskhps.sharding import ShardMap
from daskhps.table import EmbeddingTable, open_shard_store
from daskhps.table.admission import PendingCounts
from daskhps.training.resume import reshard
from daskhps.training.trainer import Trainer
from tests._clusters import SharedClusters
from tests._logs import generated_logs
from tests._runs import tiny_config

WORKERS = 4  # the shared cluster's; each case re-shards onto some of them


@pytest.fixture(scope="module")
def cluster(shared_clusters: SharedClusters) -> Iterator[ClusterHandle]:
    with start_cluster(address=shared_clusters.address(WORKERS, 1), n_workers=WORKERS) as handle:
        yield handle


@pytest.fixture(scope="module")
def checkpoints(
    tmp_path_factory: pytest.TempPathFactory,
    shared_clusters: SharedClusters,
    cluster: ClusterHandle,
) -> dict[int, Checkpoint]:
    """A tiny run trained on the 4 workers with Adam and admission (so its stores carry
    pending counts), and its last checkpoint re-sharded by the driver onto 2 and 3 workers: the old
    stores of each case."""
    tmp = tmp_path_factory.mktemp("reshard-run")
    logs = generated_logs(
        tmp_path_factory, days=1, rows_per_day=2000, parts_per_day=2, seed=5, name="logs"
    )
    d = tiny_config(
        tmp / "run",
        logs,
        passes={"examples_per_pass": 1000},
        # Adam: the widest optimizer state, and an odd row width (4 + 9 + 2 floats), which
        # the key and row words of a message must not assume even
        table={"optimizer": {"kind": "adam", "lr": 0.01}, "admission": {"min_count": 2}},
        cluster_section=shared_clusters.section(WORKERS, 1),
    )
    cfg = RunConfig.from_dict(d, source="test")
    Trainer(cfg, progress=False).run()
    four = latest_checkpoint(cfg.run.dir)
    assert four is not None and four.num_workers == WORKERS
    found = {WORKERS: four}
    for n in (2, 3):
        out = reshard(four, n, tmp / f"stores-w{n}")
        found[n] = dataclasses.replace(four, stores_dir=out, num_workers=n)
    return found


def _store(path: Path, ckpt: Checkpoint) -> dict[str, Any]:
    """Everything a rank store holds at the checkpoint's commit, rows as their bits."""
    with open_shard_store(ckpt.table_spec, path, mode="r", commit=ckpt.commit) as s:
        keys = s.keys()
        order = keys.argsort()
        keys = keys[order]
        info = next(c for c in s.commits() if c.name == ckpt.commit)
        return {
            "keys": keys.numpy(),
            "rows": s.lookup(keys).rows.view(dtype=torch.int32).numpy(),
            "attached": s.attached_names,
            "pending_keys": s.attached(PendingCounts.KEYS),
            "pending_stats": s.attached(PendingCounts.STATS),
            "meta": info.meta,
        }


def _equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert set(a) == set(b)
    for k in a:
        if isinstance(a[k], np.ndarray) or isinstance(b[k], np.ndarray):
            assert a[k] is not None and b[k] is not None, k
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def _never_on_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening any store, or looking for published versions, fails in this process (the
    driver); the workers are other processes and do not see the patch."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the driver opened a store")

    monkeypatch.setattr("daskhps.tiers.store.reader.StoreReader.__init__", refuse)
    monkeypatch.setattr("daskhps.runfiles.rundir.published_commits", refuse)


# old workers, new workers, the new rank order (indexes into the sorted worker addresses),
# which worker holds each old rank, rows per block
CASES = [
    (2, 3, [0, 1, 2], [2, 2], 97),  # one worker holds both old ranks, two hold none
    (3, 2, [1, 0], [1, 0, 1], 1000),
    (4, 3, [2, 0, 1], [0, 1, 2, 0], 50),  # 4 old ranks on 3 survivors
    (2, 4, [0, 1, 2, 3], [3, 1], 333),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "old,new,order,held_by,block", CASES, ids=[f"{c[0]}to{c[1]}" for c in CASES]
)
def test_reshard_on_workers_writes_what_the_driver_reshard_writes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cluster: ClusterHandle,
    checkpoints: dict[int, Checkpoint],
    old: int,
    new: int,
    order: list[int],
    held_by: list[int],
    block: int,
) -> None:
    ckpt = checkpoints[old]
    addrs = [cluster.addresses[i] for i in order]
    holders = {r: cluster.addresses[i] for r, i in enumerate(held_by)}
    with monkeypatch.context() as m:
        _never_on_the_driver(m)
        report = reshard_on_workers(
            cluster.client, ckpt, holders, addrs, tmp_path / "dist", block_rows=block
        )
    model = reshard(ckpt, new, tmp_path / "model")
    spec = ckpt.table_spec
    stores = {}
    for j in range(new):
        want = _store(model / spec.name / f"rank-{j}", ckpt)
        got = _store(tmp_path / "dist" / spec.name / f"rank-{j}", ckpt)
        _equal(got, want)
        stores[j] = got
    assert sum(len(s["pending_keys"]) for s in stores.values()) > 0  # counts were carried
    _check_report(report, ckpt, holders, addrs, block)


@pytest.mark.slow
def test_any_row_bits_in_blocks_of_one_row(
    tmp_path: Path, cluster: ClusterHandle, checkpoints: dict[int, Checkpoint]
) -> None:
    """Rows of arbitrary bits (NaN payloads, -0.0, subnormals) arrive as they were, and a
    block of one row makes rounds in which a rank receives nothing; old rank 1 carries no
    pending counts while old rank 0 does."""
    ckpt = dataclasses.replace(checkpoints[2], stores_dir=tmp_path / "stores")
    spec = ckpt.table_spec
    g = np.random.default_rng(11)
    keys = g.permutation(np.unique(g.integers(-(2**62), 2**62, 80, dtype=np.int64)))
    for r, mine in enumerate(np.array_split(keys, 2)):
        bits = g.integers(-(2**31), 2**31, (len(mine), spec.width), dtype=np.int64)
        rows = torch.from_numpy(bits.astype(np.int32)).view(torch.float32)
        pkeys = np.sort(g.choice(2**40, 7, replace=False)) + r  # not admitted: no rows
        counts = PendingCounts(pkeys, g.integers(1, 9, (7, 2)).astype(np.int32))
        path = ckpt.store_path(r)
        with open_shard_store(spec, path, mode="w") as s:
            s.upsert(torch.from_numpy(mine), rows)
            s.commit(ckpt.commit, {}, counts.arrays() if r == 0 else None)
    addrs = cluster.addresses[1:]
    holders = {0: addrs[2], 1: addrs[2]}
    report = reshard_on_workers(
        cluster.client, ckpt, holders, addrs, tmp_path / "dist", block_rows=1
    )
    model = reshard(ckpt, 3, tmp_path / "model")
    for j in range(3):
        want = _store(model / spec.name / f"rank-{j}", ckpt)
        _equal(_store(tmp_path / "dist" / spec.name / f"rank-{j}", ckpt), want)
    assert report.rows == len(keys) and report.ranks[0].rounds == len(keys) + 7
    assert sum(r.pending_written for r in report.ranks) == 7


def _check_report(
    report: ReshardReport,
    ckpt: Checkpoint,
    holders: dict[int, str],
    addrs: list[str],
    block: int,
) -> None:
    """The figures against what the old stores hold (read here, by the test)."""
    new_map = ShardMap(ckpt.num_shards, len(addrs))
    rows = moved = pending = pending_moved = 0
    for r in range(ckpt.num_workers):
        with ckpt.open_store(r) as s:
            keys, pkeys = s.keys(), s.attached(PendingCounts.KEYS)
        holder = addrs.index(holders[r])
        rows += len(keys)
        moved += int((new_map.worker(keys) != holder).sum())
        pkeys = np.empty(0, np.int64) if pkeys is None else pkeys
        pending += len(pkeys)
        pending_moved += int((new_map.worker(pkeys) != holder).sum())
    assert report.rows == rows and sum(r.rows_read for r in report.ranks) == rows
    assert report.rows_moved == moved > 0
    assert report.min_bytes == moved * (ckpt.table_spec.row_bytes + 8)
    assert sum(r.pending_read for r in report.ranks) == pending
    assert sum(r.pending_written for r in report.ranks) == pending
    # the rows that change worker, each pending count that does (key, count, day: 16 bytes),
    # and each round's counts to every other rank
    world = len(addrs)
    counts = sum(r.rounds for r in report.ranks) * 8 * (world - 1)
    assert report.bytes_moved == report.min_bytes + 16 * pending_moved + counts
    assert report.bytes_moved == sum(r.bytes_received for r in report.ranks)
    rounds = {r.rounds for r in report.ranks}
    assert len(rounds) == 1 and rounds.pop() > 2  # several rounds, the same on every rank
    for j, r in enumerate(report.ranks):
        assert (r.rank, r.address) == (j, addrs[j])
        assert r.old_ranks == tuple(o for o, a in sorted(holders.items()) if a == addrs[j])
        assert r.rows_read <= block * r.rounds and r.seconds > 0 and r.cpu_seconds > 0
    assert report.to_workers == world and report.from_workers == ckpt.num_workers


def test_an_old_rank_without_a_holder_is_refused(
    tmp_path: Path, cluster: ClusterHandle, checkpoints: dict[int, Checkpoint]
) -> None:
    ckpt = checkpoints[3]
    addrs = cluster.addresses[:2]
    with pytest.raises(ResumeError, match=r"old rank 1 has no holder among the workers") as e:
        reshard_on_workers(
            cluster.client, ckpt, {0: addrs[0], 2: addrs[1]}, addrs, tmp_path / "out"
        )
    assert "\n" not in str(e.value)
    stranger = "tcp://127.0.0.1:1"
    with pytest.raises(ResumeError, match=rf"old rank 2 is held by worker {stranger}, which"):
        reshard_on_workers(
            cluster.client, ckpt, {0: addrs[0], 1: addrs[0], 2: stranger}, addrs, tmp_path / "o"
        )
    with pytest.raises(ResumeError, match=r"its own stores are there"):
        reshard_on_workers(
            cluster.client, ckpt, {0: addrs[0], 1: addrs[0], 2: addrs[1]}, addrs, ckpt.stores_dir
        )
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


def test_published_versions_and_a_missing_store_are_refused_on_the_workers(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cluster: ClusterHandle,
    checkpoints: dict[int, Checkpoint],
) -> None:
    ckpt = checkpoints[2]
    spec = ckpt.table_spec
    addrs = cluster.addresses[:2]
    holders = {0: addrs[0], 1: addrs[1]}
    out = tmp_path / "out"
    with EmbeddingTable.open(spec, out / spec.name / "rank-0", device_rows=200) as t:
        t.stage(torch.arange(10))
        t.commit("version-v000001")
    before = sorted((p.relative_to(out), p.stat().st_size) for p in out.rglob("*") if p.is_file())
    with monkeypatch.context() as m:
        _never_on_the_driver(m)
        with pytest.raises(
            ResumeError,
            match=rf"on worker {addrs[0]} \(new rank 0\): the stores in .* hold published "
            r"versions \(version-v000001\)",
        ):
            reshard_on_workers(cluster.client, ckpt, holders, addrs, out)
        after = sorted(
            (p.relative_to(out), p.stat().st_size) for p in out.rglob("*") if p.is_file()
        )
        assert after == before
        gone = dataclasses.replace(ckpt, stores_dir=tmp_path / "nowhere")
        with pytest.raises(
            ResumeError,
            match=rf"on worker {addrs[0]} \(new rank 0\): the store of old rank 0 .* is not on "
            "this worker's disk",
        ):
            reshard_on_workers(cluster.client, gone, holders, addrs, tmp_path / "new")

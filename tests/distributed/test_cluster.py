"""Cluster start, a run's hosts (process group, shards) through a real LocalCluster."""

from __future__ import annotations

import re
import time

import pytest
import torch

from daskhps.distributed import (
    ClusterError,
    CommError,
    RunGroup,
    TierSizing,
    WorkerLostError,
    WorkerShards,
    run_pinned,
    start_cluster,
)
from daskhps.passes.owners import worker_addresses
from daskhps.sharding import ShardMap
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec
from tests._clusters import WORKER_MEMORY
from tests.distributed import _tasks

SPEC = TableSpec(_tasks.TABLE, dim=4, optimizer=OptimizerSpec(kind="sgd", lr=1.0), seed=1)


@pytest.fixture(scope="module")
def cluster():
    with start_cluster(
        n_workers=2,
        threads_per_worker=2,
        memory_limit=WORKER_MEMORY,
        dashboard_address="127.0.0.1:0",
    ) as handle:
        yield handle


@pytest.mark.slow
def test_shards_comm_and_exchange_on_worker_processes(cluster, tmp_path):
    client, addrs = cluster.client, cluster.addresses
    assert cluster.kind == "local" and len(addrs) == 2 and list(addrs) == sorted(addrs)
    assert cluster.dashboard_link and "127.0.0.1" in cluster.dashboard_link

    shards = WorkerShards([SPEC], tmp_path / "stores", TierSizing(0.05, 0.05))
    group = RunGroup.start(client, addrs, shards=shards, timeout_s=20)
    assert group.backend == "gloo" and group.world_size == 2
    sizes = group.on_shards(WorkerShards.open)  # opened by start: opening again is a no-op
    assert [s[_tasks.TABLE]["rank"] for s in sizes] == [0, 1]
    assert all(s[_tasks.TABLE]["device_rows"] > 1000 for s in sizes)

    # Stage each owner's keys, then exchange every rank's batch over the group.
    smap = ShardMap(_tasks.NUM_SHARDS, 2)
    batches = [torch.arange(0, 300, 3), torch.arange(100, 400, 2)]
    every = torch.unique(torch.cat(batches))
    owned = [every[smap.worker(every) == r] for r in range(2)]
    reports = group.on_shards(WorkerShards.stage, _tasks.TABLE, rank_args=[(o,) for o in owned])
    assert [r.rows for r in reports] == [len(o) for o in owned]

    assert group.run(_tasks.all_reduce) == [[3.0] * 3, [3.0] * 3]
    got = group.run(_tasks.exchange, rank_args=[(b,) for b in batches])

    with EmbeddingTable.open(SPEC, tmp_path / "ref", device_rows=1000) as ref:
        for keys, rows in got:
            assert torch.equal(rows, ref.lookup(keys, read_only=True))

    stats = group.on_shards(WorkerShards.stats)
    assert [s["rank"] for s in stats] == [0, 1]
    assert [s["tables"][_tasks.TABLE]["pinned"] for s in stats] == [len(o) for o in owned]
    group.on_shards(WorkerShards.commit, "pass-0")
    group.close_shards()
    group.close()
    with pytest.raises(ClusterError, match="has no host of run"):
        group.run(_tasks.all_reduce)  # the run's hosts are gone from the workers
    for r in range(2):
        assert (tmp_path / "stores" / _tasks.TABLE / f"rank-{r}").is_dir()
    # Closed shards released their locks: the stores reopen here, holding the pushed
    # updates (SGD with lr 1: minus one per rank whose batch held the key).
    with EmbeddingTable.open(SPEC, tmp_path / "ref2", device_rows=1000) as ref:
        ukeys = torch.cat([torch.unique(b) for b in batches])
        ref.apply_gradients(ukeys, torch.ones(len(ukeys), SPEC.dim))
        for r in range(2):
            path = tmp_path / "stores" / _tasks.TABLE / f"rank-{r}"
            with EmbeddingTable.open(SPEC, path, device_rows=1000, mode="r") as shard:
                want = ref.lookup(owned[r], read_only=True)
                assert torch.equal(shard.lookup(owned[r], read_only=True), want)


@pytest.mark.slow
def test_staging_ahead_that_does_not_fit_is_an_answer_not_a_task_failure(cluster, tmp_path):
    client, addrs = cluster.client, cluster.addresses
    shards = WorkerShards([SPEC], tmp_path / "stores", TierSizing(device_rows=100))
    with RunGroup.start(client, addrs, shards=shards, timeout_s=20) as group:
        first = group.on_shards(WorkerShards.try_stage, _tasks.TABLE, torch.arange(60))
        assert all(a.fitted for a in first) and [a.report.rows for a in first] == [60, 60]
        # 60 pinned + 60 new > 100 rows: every rank answers, none fails
        second = group.on_shards(WorkerShards.try_stage, _tasks.TABLE, torch.arange(60, 120))
        assert not any(a.fitted for a in second)
        assert all("does not fit the device tier" in str(a.refusal) for a in second)
        stats = group.on_shards(WorkerShards.stats)
        assert [s["tables"][_tasks.TABLE]["pinned"] for s in stats] == [60, 60]
        # without the "ahead" reading, the same refusal is an error
        with pytest.raises(Exception, match="does not fit the device tier"):
            group.on_shards(WorkerShards.stage, _tasks.TABLE, torch.arange(60, 120))
        group.close_shards()


def test_thread_workers_get_explicit_groups():
    """Two ranks in one process (threads): explicit groups, no default group needed."""
    with start_cluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as handle:
        assert handle.dashboard_link is None
        with RunGroup.start(handle.client, timeout_s=10) as group:
            assert group.run(_tasks.all_reduce) == [[3.0] * 3, [3.0] * 3]


def test_rank_that_cannot_join_fails_within_timeout():
    """Rank 1's only thread is busy: rank 0 gives up after the timeout, with a clear error."""
    with start_cluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as handle:
        busy = handle.client.submit(
            _tasks.sleep, 3.0, workers=[handle.addresses[1]], allow_other_workers=False, pure=False
        )
        time.sleep(0.2)
        t0 = time.monotonic()
        with pytest.raises(CommError, match="could not form the process group within 1 s"):
            RunGroup.start(handle.client, timeout_s=1)
        assert time.monotonic() - t0 < 2.9  # before the busy task ends
        busy.result()


@pytest.mark.slow
def test_worker_killed_fails_the_run_with_a_clear_error():
    with start_cluster(
        n_workers=2, threads_per_worker=1, memory_limit=WORKER_MEMORY, dashboard_address=None
    ) as handle:
        # Mid-collective: rank 0's all-reduce fails as soon as rank 1's process is gone.
        group = RunGroup.start(handle.client, timeout_s=5)
        t0 = time.monotonic()
        with pytest.raises(CommError, match=r"all_reduce failed.*a peer rank was lost") as ei:
            group.run(_tasks.die_in_collective)
        assert time.monotonic() - t0 < 5
        # a run may recover from it (cluster.max_restarts): only the trainer, when it gives
        # up, says the run stopped and how to resume
        assert "cannot continue" not in str(ei.value) and "--resume" not in str(ei.value)
        # gloo's reason without its source path and its banner for crash reports
        assert "Connection closed by peer" in str(ei.value), str(ei.value)
        assert "GLHF" not in str(ei.value) and "third_party" not in str(ei.value)
        group.close()

        # Outside any collective: the client notices the worker leaving and names the rank.
        handle.client.wait_for_workers(2, timeout=30)
        addrs = worker_addresses(handle.client)
        t0 = time.monotonic()
        lost = re.escape(f"rank 1 ({addrs[1]}) left the cluster")
        with pytest.raises(WorkerLostError, match=lost):
            run_pinned(handle.client, addrs, _tasks.die_or_sleep, rank_args=[(0,), (1,)])
        assert time.monotonic() - t0 < 5  # long before rank 0's task would end


def test_gpus_true_without_cuda_is_a_clear_error():
    from daskhps.distributed import cuda_available

    if cuda_available():
        pytest.skip("this machine has CUDA and dask_cuda")
    with pytest.raises(ClusterError, match="gpus=True needs dask_cuda"):
        start_cluster(gpus=True)


def test_unreachable_scheduler_is_a_clear_error():
    # a port that refuses connections is said at once, whatever the wait for a scheduler
    # that is starting (tests/distributed/test_cluster_messages.py)
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"no Dask scheduler there \(connection refused"):
        start_cluster(address="tcp://127.0.0.1:1", wait_timeout_s=60)
    assert time.monotonic() - t0 < 30


def _profile_history(dask_worker) -> tuple[int | None, int | None]:  # type: ignore[no-untyped-def]
    return dask_worker.profile_history.maxlen, dask_worker.profile_keys_history.maxlen


@pytest.mark.slow
def test_embedded_workers_keep_two_minutes_of_profile(cluster) -> None:
    """A second of Dask's worker profile is about 0.12 MiB at daskhps's stacks; the default
    1000 seconds of history grew a worker by about 120 MiB over a long run."""
    from daskhps.distributed.cluster import PROFILE_HISTORY_CYCLES

    kept = cluster.client.run(_profile_history)
    assert set(kept.values()) == {(PROFILE_HISTORY_CYCLES, PROFILE_HISTORY_CYCLES)}
    import dask

    # The setting is the embedded cluster's only: the driver's own config is untouched.
    assert dask.config.get("distributed.admin.low-level-log-length") == 1000

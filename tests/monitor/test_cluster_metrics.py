"""On a real LocalCluster (2 worker processes): the run's shard figures in ``scheduler_info()``,
on each worker's ``/metrics``, stage time on the Fine Performance Metrics, and the dashboard
on localhost (with a sensible fallback when its port is taken)."""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
import torch

from daskhps.data import read_click_log
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.distributed import (
    RunGroup,
    TierSizing,
    WorkerShards,
    start_cluster,
)
from daskhps.distributed.cluster import ClusterHandle
from daskhps.monitor import announce_pass, metric_name
from daskhps.passes import PassConfig, build_plan, place_on_workers, plan_owner_keys
from daskhps.sharding import ShardMap
from daskhps.table import OptimizerSpec, TableSpec
from tests._clusters import WORKER_MEMORY

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Port .* is already in use:UserWarning"),  # the fallback
]

SPEC = TableSpec("clicks", dim=4, optimizer=OptimizerSpec(kind="sgd"))
KEYS_PER_RANK = (300, 500)


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    """A port on 127.0.0.1 that something else already listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory, busy_port: int) -> Iterator[Any]:
    handle = start_cluster(
        n_workers=2,
        threads_per_worker=1,
        memory_limit=WORKER_MEMORY,
        processes=True,
        dashboard_address=f"127.0.0.1:{busy_port}",
    )
    try:
        client, addresses = handle.client, list(handle.addresses)
        shards = WorkerShards(
            [SPEC],
            tmp_path_factory.mktemp("stores"),
            TierSizing(device_rows=1000, host_bytes=0),
        )
        group = RunGroup.start(client, addresses, shards=shards, timeout_s=30)
        keys = [(torch.arange(n),) for n in KEYS_PER_RANK]
        group.on_shards(WorkerShards.stage, "clicks", rank_args=keys, what="stage shards")
        group.on_shards(WorkerShards.commit, "first", what="commit shards")
        group.on_shards(WorkerShards.stats)  # as the trainer does after each pass
        yield handle
        group.close_shards()
        group.close()
    finally:
        handle.close()


def _worker_metrics(handle: ClusterHandle, timeout_s: float = 15.0) -> dict[str, dict]:
    """Each worker's heartbeat metrics, once every worker's snapshot shows its rows (it is
    refreshed every ``ShardMetrics.refresh_s`` and sent with the next heartbeat)."""
    name = metric_name("clicks", "rows_device")
    deadline = time.monotonic() + timeout_s
    while True:
        info = handle.client.scheduler_info(n_workers=-1)["workers"]
        got = {a: info[a]["metrics"] for a in handle.addresses}
        if all(m.get(name, 0) > 0 for m in got.values()) or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def test_scheduler_info_shows_each_workers_figures(staged):
    got = _worker_metrics(staged)
    for rank, address in enumerate(staged.addresses):
        m = got[address]
        assert m[metric_name("clicks", "rows_staged")] == KEYS_PER_RANK[rank]
        assert m[metric_name("clicks", "rows_device")] == KEYS_PER_RANK[rank]
        assert m[metric_name("clicks", "hit_rate_init")] == 1.0
        assert m[metric_name("clicks", "bytes_store")] > 0  # committed rows on disk
        assert m[metric_name("clicks", "pinned_rows")] == KEYS_PER_RANK[rank]
        assert m["daskhps_pass"] == -1


def _scrape(handle: ClusterHandle, address: str) -> str:
    info = handle.client.scheduler_info(n_workers=-1)["workers"][address]
    port = info["services"]["dashboard"]
    host = urlparse(address).hostname
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def _sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {labels} in /metrics")


def test_each_workers_metrics_endpoint_exports_them(staged):
    _worker_metrics(staged)
    for rank, address in enumerate(staged.addresses):
        text = _scrape(staged, address)
        n = KEYS_PER_RANK[rank]
        assert _sample(text, "daskhps_rows_staged_total", worker=address, table="clicks") == n
        assert _sample(text, "daskhps_rows", worker=address, tier="device") == n
        assert _sample(text, "daskhps_hit_rate", worker=address, tier="init") == 1.0
        assert _sample(text, "daskhps_stage_seconds_total", worker=address, stage="stage") > 0
        assert _sample(text, "daskhps_stage_seconds_total", worker=address, stage="checkpoint") > 0
        # Worker processes: each /metrics lists its own worker only.
        other = staged.addresses[1 - rank]
        assert f'worker="{other}"' not in text


def test_stage_time_reaches_the_fine_performance_metrics(staged):
    def cumulative(dask_scheduler: Any) -> dict:
        return dict(dask_scheduler.cumulative_worker_metrics)

    metrics = staged.client.run_on_scheduler(cumulative)
    labels = {
        (k[1], k[2]) for k in metrics if isinstance(k, tuple) and k[0] == "execute" and len(k) > 3
    }
    assert ("daskhps-stage-shards", "stage") in labels
    assert ("daskhps-commit-shards", "checkpoint") in labels
    assert ("daskhps-commit-shards", "write-back") in labels


def test_dashboard_stays_on_localhost_and_moves_off_a_taken_port(staged, busy_port):
    link = urlparse(staged.dashboard_link or "")
    assert link.hostname == "127.0.0.1" and link.port not in (None, busy_port)
    sockets = staged.cluster.scheduler.http_server._sockets.values()
    assert {s.getsockname()[0] for s in sockets} == {"127.0.0.1"}
    with urllib.request.urlopen(f"http://127.0.0.1:{link.port}/health", timeout=10) as r:
        assert r.read() == b"ok"
    assert re.match(r"tcp://127\.0\.0\.1:\d+", staged.addresses[0])  # workers too


def _sleep_a_little(host: Any) -> int:
    time.sleep(0.05)
    return int(host.rank)


def test_collective_tasks_are_metered_as_train_and_eval_and_the_pass_is_shown(staged):
    client, addresses = staged.client, list(staged.addresses)
    with RunGroup.start(client, addresses, timeout_s=30) as group:
        assert group.run(_sleep_a_little, what="train pass", stage="train") == [0, 1]
        group.run(_sleep_a_little, what="eval holdout", stage="eval")
    announce_pass(client, addresses, 7)

    def cumulative(dask_scheduler: Any) -> dict:
        return dict(dask_scheduler.cumulative_worker_metrics)

    deadline = time.monotonic() + 15
    while True:  # digests reach the scheduler with the workers' heartbeats
        metrics = staged.client.run_on_scheduler(cumulative)
        seconds = {
            (k[1], k[2]): v
            for k, v in metrics.items()
            if isinstance(k, tuple) and k[0] == "execute" and k[-1] == "seconds"
        }
        info = client.scheduler_info(n_workers=-1)["workers"]
        passes = [info[a]["metrics"].get("daskhps_pass") for a in addresses]
        done = ("daskhps-eval-holdout", "eval") in seconds and passes == [7, 7]
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert seconds[("daskhps-train-pass", "train")] >= 2 * 0.05 * 0.9  # both ranks
    assert seconds[("daskhps-eval-holdout", "eval")] >= 2 * 0.05 * 0.9
    assert passes == [7, 7]


def test_read_hash_dedup_and_shuffle_are_metered(staged, tmp_path):
    gen = GeneratorConfig(days=1, rows_per_day=2000, parts_per_day=2, vocab_scale=0.01)
    generate(gen, tmp_path)
    log = read_click_log(str(tmp_path)).persist()
    plan = build_plan(log, PassConfig(examples_per_pass=2000, global_batch_size=100), 2)
    owned = plan_owner_keys(log, plan, plan.passes[0], ShardMap(8, 2))
    placed = place_on_workers(staged.client, owned, list(staged.addresses))
    assert sum(len(p) for p in staged.client.gather(list(placed.futures))) > 0

    def labels(dask_scheduler: Any) -> list[str]:
        return [
            k[2]
            for k in dask_scheduler.cumulative_worker_metrics
            if isinstance(k, tuple) and k[0] == "execute" and k[-1] == "seconds"
        ]

    want = {"read", "hash", "dedup", "shuffle"}
    deadline = time.monotonic() + 15
    while not want <= set(staged.client.run_on_scheduler(labels)):
        assert time.monotonic() < deadline, staged.client.run_on_scheduler(labels)
        time.sleep(0.5)

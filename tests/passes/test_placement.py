"""Each worker's partition is built on that worker: the tasks after the shuffle run on the
owner, and the finished partition is never copied from another worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import pytest
from distributed import Client, LocalCluster, get_task_stream, wait

from daskhps.data import read_click_log
from daskhps.passes import PassConfig, build_plan, place_together, plan_owner_keys
from daskhps.passes.placement import owner_tasks
from daskhps.sharding import ShardMap
from daskhps.training.examples import route_examples


def test_owner_tasks_pin_the_shuffle_output_and_what_follows() -> None:
    """Two inputs split for two ranks: the concat and finish of rank w run on w; reading,
    splitting, and taking a rank's piece out of a split (shared data) stay unpinned."""

    def task(*deps: str) -> tuple[Any, ...]:
        return (max, 0, *deps)

    graph: dict[str, Any] = {"alone1": task()}  # only rank 1's output reads it: pinned
    for i in range(2):
        graph[f"read{i}"] = task()
        graph[f"split{i}"] = task(f"read{i}")
        for w in range(2):
            graph[f"piece{i}-{w}"] = task(f"split{i}")
    for w in range(2):
        graph[f"concat{w}"] = task(f"piece0-{w}", f"piece1-{w}")
        graph[f"finish{w}"] = task(f"concat{w}")
    graph["sort0"] = task("concat0")
    graph["sort1"] = task("concat1", "alone1")
    assert owner_tasks(graph, [["finish0", "finish1"], ["sort0", "sort1"]]) == {
        "concat0": 0,
        "finish0": 0,
        "sort0": 0,
        "concat1": 1,
        "finish1": 1,
        "sort1": 1,
        "alone1": 1,
    }


def test_owner_tasks_leave_what_follows_a_p2p_shuffle_where_p2p_puts_it() -> None:
    """p2p picks the worker of each output partition itself: the steps after it stay there
    (they may shrink the partition before it moves), and what precedes the barrier is
    shared by every partition."""

    def task(*deps: str) -> tuple[Any, ...]:
        return (max, 0, *deps)

    graph: dict[str, Any] = {"read0": task(), "read1": task()}
    graph["transfer0"], graph["transfer1"] = task("read0"), task("read1")
    graph["shuffle-barrier-x"] = task("transfer0", "transfer1")
    for w in range(2):
        graph[f"unpack{w}"] = task("shuffle-barrier-x")
        graph[f"finish{w}"] = task(f"unpack{w}")
    graph["alone0"], graph["other1"] = task(), task()  # a second frame, no shuffle
    graph["other0"] = task("alone0")
    outputs = [["finish0", "finish1"], ["other0", "other1"]]
    assert owner_tasks(graph, outputs) == {"alone0": 0, "other0": 0, "other1": 1}


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


def _moved_keys(client: Client) -> set[Any]:
    """Every key a worker fetched from another one since its log was last cleared."""
    logs = client.run(lambda dask_worker: list(dask_worker.transfer_incoming_log))
    return {key for log in logs.values() for entry in log for key in entry["keys"]}


def _clear_transfer_logs(client: Client) -> None:
    client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())


@pytest.mark.parametrize("shuffle_method", ["tasks", "p2p"])
def test_partitions_are_built_on_their_owner(
    client: Client, log_dir: Path, shuffle_method: str
) -> None:
    log = read_click_log(str(log_dir)).persist()
    cfg = PassConfig(
        examples_per_pass=12000,
        global_batch_size=1000,
        num_shards=32,
        shuffle_method=shuffle_method,
    )
    plan = build_plan(log, cfg, num_workers=2)
    spec = plan.passes[0]
    addresses = sorted(client.scheduler_info()["workers"])
    with dask.config.set({"dataframe.shuffle.method": shuffle_method}):  # route_examples'
        owned = plan_owner_keys(log, plan, spec, ShardMap(32, 2))
        routed = route_examples(
            log.frame,
            plan.partition_lengths,
            spec.start,
            spec.stop,
            batch_size=1000,
            num_workers=2,
        )
        outputs = [list(f.optimize().__dask_keys__()) for f in (owned, routed)]
        wait(log.frame)
        _clear_transfer_logs(client)
        with get_task_stream(client) as stream:
            placed = place_together(client, [owned, routed], addresses)
            wait([f for p in placed for f in p.futures])
    ran_on = {r["key"]: r["worker"] for r in stream.data}
    moved = _moved_keys(client)
    for keys, placement in zip(outputs, placed, strict=True):
        who = client.who_has(list(placement.futures))
        for w, future in enumerate(placement.futures):
            assert ran_on[future.key] == addresses[w]
            assert list(who[future.key]) == [addresses[w]]
            assert future.key not in moved
        if shuffle_method == "tasks":
            # The futures are the frames' own partitions, not copies made by a second task.
            assert [f.key for f in placement.futures] == keys
    if shuffle_method == "tasks":
        # The shuffle's output concat of partition w ran on worker w and never moved: the
        # pieces of the shuffle went straight to their owner.
        concats = [k for k in ran_on if isinstance(k, tuple) and k[0].startswith("taskshuffle-")]
        assert len(concats) == 4  # 2 frames x 2 workers
        for key in concats:
            assert ran_on[key] == addresses[key[1]]
            assert key not in moved
    else:
        # p2p placed its outputs itself; they were finished there, never fetched unfinished.
        unpacked = [k for k in ran_on if isinstance(k, tuple) and k[0].startswith("p2pshuffle-")]
        assert len(unpacked) == 4
        assert not set(unpacked) & moved

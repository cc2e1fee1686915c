"""Pinned tasks leave nothing behind: once the caller drops a future it passed to
``run_pinned``, its data leaves the worker at once, without waiting for Python's cycle
collector (which may not run for minutes, while each pass's data piles up on the workers)."""

from __future__ import annotations

import gc
import time

import numpy as np

from daskhps.distributed import run_pinned
from tests.distributed import _tasks


def test_a_dropped_future_leaves_the_worker_without_the_cycle_collector() -> None:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        (address,) = list(client.scheduler_info()["workers"])
        gc.collect()
        gc.disable()  # what the cycle collector would free late is the bug
        try:
            data = client.scatter(np.zeros(1000), workers=[address])
            key = str(data.key)
            # Polls every 0.25 s: several "not yet" answers before the task ends.
            (n,) = run_pinned(client, [address], _tasks.slow_len, 1.0, rank_args=[(data,)])
            assert n == 1000
            assert key in client.run(_tasks.held_keys)[address]
            del data
            deadline = time.monotonic() + 10
            while key in client.run(_tasks.held_keys)[address]:
                assert time.monotonic() < deadline, "the worker still holds the dropped data"
                time.sleep(0.05)
        finally:
            gc.enable()

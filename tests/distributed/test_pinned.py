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


def test_a_finished_rank_whose_worker_dies_before_its_result_is_fetched_fails_the_call() -> None:
    """The race that once hung a run: every task finished, then a worker died before its result
    came back. Dask reschedules such a task, onto the same vanished worker, so an unbounded
    fetch waits forever. Stopping the worker first (SIGSTOP) holds the race open: the fetch
    cannot finish, then the kill lands."""
    import os
    import signal
    import threading

    from distributed import Client, LocalCluster, wait

    from daskhps.distributed import WorkerLostError
    from daskhps.distributed._pinned import gather_pinned

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        addresses = sorted(client.scheduler_info()["workers"])
        pids = client.run(os.getpid)
        futures = [
            client.submit(
                _tasks.big_ones, 1 << 20, workers=[a], allow_other_workers=False, pure=False
            )
            for a in addresses
        ]
        wait(futures)
        victim = pids[addresses[1]]
        os.kill(victim, signal.SIGSTOP)
        threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
        outcome: list[BaseException | list[object]] = []

        def gather() -> None:
            try:
                outcome.append(gather_pinned(client, futures, addresses, "commit"))
            except BaseException as e:  # the test reads it below
                outcome.append(e)

        started = time.monotonic()
        thread = threading.Thread(target=gather, daemon=True)
        thread.start()
        thread.join(60)
        assert not thread.is_alive(), "the fetch of the dead worker's result never returned"
        (error,) = outcome
        assert isinstance(error, WorkerLostError), error
        assert "rank 1" in str(error) and "commit" in str(error)
        assert time.monotonic() - started < 30

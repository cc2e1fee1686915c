"""Batch progress: rank 0's batch counts reach the driver's bar as Dask events."""

from __future__ import annotations

import io
import time

from distributed import Client, LocalCluster
from tqdm import tqdm

from daskhps.monitor.progress import BatchProgress, report_batches


def _train_like(run_id: str, total: int) -> int:
    for b in range(total):
        report_batches(run_id, b + 1, total, force=b + 1 in (3, total))
    return total


def test_report_batches_outside_a_worker_does_nothing():
    report_batches("no-worker", 1, 2, force=True)  # must not raise


def test_bar_follows_the_workers_batches_and_ends_at_the_pass_size():
    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        bar = tqdm(total=20, file=io.StringIO())  # drawn, but not on the terminal
        progress = BatchProgress(client, "run-a", bar)
        try:
            progress.start_pass()
            assert client.submit(_train_like, "run-a", 8, pure=False).result() == 8
            deadline = time.monotonic() + 10
            while bar.n < 8 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert bar.n == 8  # moved by the events, before the pass was topped up
            progress.end_pass(10)  # a pass of 10 batches: the bar ends at its end
            assert bar.n == 10
            # a late event of a finished pass does not move the bar
            progress._on_event((0.0, {"done": 9, "total": 10}))
            assert bar.n == 10
            progress.start_pass()
            client.submit(_train_like, "run-b", 5, pure=False).result()  # another run's topic
            time.sleep(0.3)
            assert bar.n == 10
        finally:
            progress.close()

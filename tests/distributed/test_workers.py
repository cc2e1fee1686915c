"""``scheduler_workers`` against the client's background refresh of its cached identity."""

from __future__ import annotations

import dask
from distributed import Client, LocalCluster

from daskhps._scheduler import scheduler_workers
from daskhps.distributed._pinned import missing_workers


def test_workers_are_never_missed_while_the_client_refreshes_its_cache():
    # The client refreshes its cache every millisecond with totals only (no "workers"): a
    # lookup through that cache sees an empty cluster now and then; the scheduler never does.
    with (
        dask.config.set({"distributed.client.scheduler-info-interval": "1ms"}),
        LocalCluster(n_workers=2, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2)
        addresses = sorted(scheduler_workers(client))
        assert len(addresses) == 2
        for _ in range(300):
            assert missing_workers(client, addresses) == []
        info = scheduler_workers(client)
        assert all("nthreads" in info[a] for a in addresses)

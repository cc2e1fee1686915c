"""Warm LocalClusters that the in-process training tests share, reached through
``cluster.address``.

A tiny test run trains for a few seconds, but starting its own LocalCluster and warming the
worker processes (torch's import, the first process group) costs as much again. Tests whose
property is what training computes (tiers that do not change the bits, one worker against two,
what a checkpoint holds) run on one of these instead, the way a run uses a cluster that is
already up; the runs of a session then pay the start once per cluster shape. Tests of the
embedded cluster itself (a run starting and stopping its own, Ctrl-C, a killed driver whose
workers must exit) keep starting their own.

The clusters are worker processes of :data:`WORKER_MEMORY` each, like the tests' embedded ones,
and no Client of their own: a default Client left behind would send every other test's
``compute()`` to them.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from daskhps.capacity.estimate import CUDA_BUILD_BYTES

if TYPE_CHECKING:
    from distributed import LocalCluster

__all__ = ["PLANNED_MEMORY", "WORKER_MEMORY", "SharedClusters"]

# Each test worker's memory limit. A warm worker (torch, pandas, zarr and daskhps imported, a
# run trained) sits at about 0.5 GiB with the CPU build of torch and 0.85 GiB with the CUDA
# build, whose libraries alone add a third of a GiB: at 1 GiB the CUDA build put every worker
# past Dask's pause line (80%), and a paused worker's tasks wait for ever. 2 GiB leaves either
# build a margin (tests/distributed/test_worker_margin.py measures it).
WORKER_MEMORY = "2GiB"
# The memory limit of the 1 GiB worker the sizing tests plan for, plus what the installed torch
# build adds to a worker's own memory (the plan counts it too): their figures then hold with
# either build.
PLANNED_MEMORY = (1 << 30) + CUDA_BUILD_BYTES


class SharedClusters:
    """One LocalCluster per (workers, threads per worker), started on first use."""

    def __init__(self) -> None:
        self._clusters: dict[tuple[int, int], LocalCluster] = {}

    def address(self, workers: int, threads: int) -> str:
        key = (workers, threads)
        if key not in self._clusters:
            # The scheduler runs in this process: its p2p shuffle plugin logs every shuffle's
            # start and end at WARNING, as start_cluster quiets it for an embedded cluster.
            logging.getLogger("distributed.shuffle._scheduler_plugin").setLevel(logging.ERROR)
            # Imported here, not when conftest imports this module: importing distributed
            # configures its loggers, and before pytest's logging capture starts that left
            # tests unable to capture them.
            from distributed import LocalCluster

            self._clusters[key] = LocalCluster(
                n_workers=workers,
                threads_per_worker=threads,
                memory_limit=WORKER_MEMORY,
                processes=True,
                dashboard_address="127.0.0.1:0",
                scheduler_kwargs={"dashboard": False},
            )
        return str(self._clusters[key].scheduler_address)

    def section(self, workers: int, threads: int) -> dict[str, Any]:
        """A config's ``cluster`` section that runs on the shared cluster of this shape."""
        return {"address": self.address(workers, threads), "gpu": False}

    def close(self) -> None:
        """Close every cluster, all at once: a worker that trained takes seconds to exit."""
        clusters, self._clusters = list(self._clusters.values()), {}
        if clusters:
            with ThreadPoolExecutor(len(clusters)) as pool:
                list(pool.map(lambda c: c.close(), clusters))

"""The suite's workers keep a margin under Dask's pause line.

Dask pauses a worker whose process memory passes ``distributed.worker.memory.pause`` (80%) of
its limit: its tasks then wait, and a run's pass waits with them. A warm worker's own memory
(torch and daskhps imported, a run trained) must leave room below that line for what a test run
adds (tiers, batches, the store's index), whichever build of torch is installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import dask
import pytest
from dask.utils import parse_bytes
from distributed import Client

from daskhps.config.runconfig import RunConfig
from daskhps.training.trainer import Trainer
from tests._clusters import WORKER_MEMORY, SharedClusters
from tests._logs import generated_logs
from tests._runs import tiny_config

# A warm worker may hold at most this share of the memory below the pause line.
MARGIN = 0.6


def _rss() -> int:
    import psutil

    return int(psutil.Process(os.getpid()).memory_info().rss)


@pytest.mark.slow
def test_a_warm_worker_sits_well_under_the_pause_line(
    tmp_path_factory: pytest.TempPathFactory, shared_clusters: SharedClusters
) -> None:
    logs = generated_logs(tmp_path_factory, days=1, rows_per_day=600, parts_per_day=1, seed=3)
    d = tiny_config(Path(tmp_path_factory.mktemp("margin")) / "run", logs)
    d["cluster"] = shared_clusters.section(workers=1, threads=2)
    Trainer(RunConfig.from_dict(d, source="test"), progress=False).run()
    with Client(d["cluster"]["address"]) as client:
        used = client.run(_rss)
    pause = float(dask.config.get("distributed.worker.memory.pause"))
    line = pause * parse_bytes(WORKER_MEMORY)
    assert used and all(rss <= MARGIN * line for rss in used.values()), (
        {w: f"{rss / 2**20:.0f} MiB" for w, rss in used.items()},
        f"pause line {line / 2**20:.0f} MiB",
    )

"""``plan``'s memory figure against a real worker's memory growth on a real run.

What is compared: the resident set size (RSS) of the one worker process of a LocalCluster,
sampled every 10 ms by a thread inside it, from just before training (the worker already
warmed: torch, daskhps and a dense model built once, so imports and the allocator's start
are not counted) to the peak of the run, against the total of ``size_run(...).memory`` for
the same config with the keys counted by ``--scan``. The tiers are sized at tens of MB and
the run has more distinct keys than device and host hold together, so both tiers are filled
(written, hence resident) and rows spill to the zarr store.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from daskhps.capacity import size_run
from daskhps.config import RunConfig
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.training.trainer import Trainer

LIMIT = 2 << 30
_SAMPLES: list[int] = []
_STOP = threading.Event()


def _start_sampling() -> int:
    """In the worker: record RSS every 10 ms until told to stop; returns the RSS now."""
    import psutil

    proc = psutil.Process()
    _SAMPLES.clear()
    _STOP.clear()
    base = proc.memory_info().rss

    def sample() -> None:
        while not _STOP.is_set():
            _SAMPLES.append(proc.memory_info().rss)
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()
    return base


def _stop_sampling() -> int:
    _STOP.set()
    time.sleep(0.05)
    return max(_SAMPLES)


def _config(tmp: Path, logs: Path, address: str, *, warm_up: bool = False) -> RunConfig:
    name = "warm-up" if warm_up else "growth"
    tiers = {"device": {"rows": 30_000}, "host": {"fraction": 0.013}}
    if warm_up:
        tiers = {"device": {"rows": 8_000}, "host": {"fraction": 0.001}}
    return RunConfig.from_dict(
        {
            "run": {"name": name, "dir": str(tmp / name), "seed": 0, "quiet": True},
            "data": {"train": {"paths": [str(logs)]}},
            "passes": {"epochs": 1, "examples_per_pass": 1000, "global_batch_size": 250},
            "table": {
                "dim": 64,
                "optimizer": {"kind": "adam", "lr": 0.01},  # 193 floats a row
                "tiers": tiers,
            },
            "model": {"name": "dlrm", "options": {"bottom_mlp": [16, 64], "top_mlp": [16]}},
            "dense_optimizer": {"kind": "sgd", "lr": 0.05},
            "cluster": {"address": address, "gpu": False},
        },
        source="growth.yaml",
    )


@pytest.mark.slow
def test_plan_memory_within_20_percent_of_worker_growth(tmp_path: Path) -> None:
    from distributed import Client, LocalCluster

    logs, small = tmp_path / "logs", tmp_path / "small"
    generate(GeneratorConfig(days=1, rows_per_day=18000, parts_per_day=2, seed=5), str(logs))
    generate(GeneratorConfig(days=1, rows_per_day=2000, parts_per_day=2, seed=6), str(small))
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            memory_limit=LIMIT,
            dashboard_address=None,
            processes=True,
        ) as cluster,
        Client(cluster) as client,
    ):
        address = cluster.scheduler_address
        # An idle worker that has trained once: imports, the process group's first setup and
        # the allocators' start are in the baseline, not in the growth.
        Trainer(_config(tmp_path, small, address, warm_up=True), progress=False).run()
        cfg = _config(tmp_path, logs, address)
        report = size_run(cfg, scan=True, workers=1, memory_limit=LIMIT)
        memory = report.memory
        assert memory is not None
        (base,) = client.run(_start_sampling).values()
        result = Trainer(cfg, progress=False).run()
        (peak,) = client.run(_stop_sampling).values()
    tiers: dict[str, Any] = result.passes[-1]["tiers"]
    # Every tier touched: the device tier full, the host tier (almost) full, every row
    # written to the store at the end. Nothing is read back from the store (its memory maps
    # would depend on the page cache): the upper tiers hold every key.
    keys = report.keys.distinct_keys
    assert keys is not None and memory.host is not None
    assert memory.device.rows < keys <= memory.device.rows + memory.host.rows
    assert keys - memory.device.rows >= 0.9 * memory.host.rows
    assert tiers["store_rows_written"] >= keys
    assert tiers["rows_from"]["store"] == 0
    growth = peak - base
    assert memory.tiers > 0.8 * memory.total  # the tiers dominate what is compared
    assert abs(memory.total - growth) <= 0.2 * growth, (memory.to_dict(), growth)

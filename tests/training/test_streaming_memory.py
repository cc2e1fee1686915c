"""Training streams the log pass by pass: a worker's memory does not grow with the log.

One worker process on a real LocalCluster trains the same config on a log and on a log four
times as long (the same vocabulary, so the same table), with a fraction holdout evaluated
after every pass. A thread inside the worker samples its resident set size every 10 ms
through each run. Its peak minus the table's resident bytes (tiers and store index, as the
shards' ``stats()`` report them) must not grow by more than 10% from the short log to the
long one: the passes' rows are read, routed and released one pass at a time, and the holdout
is set aside during the planning scan and evaluated in chunks.

The long log is one file, longer than ``data.block_size``, so it is also read in byte ranges
(one partition per block, not one per file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from daskhps.capacity.measured import start_sampling, stop_sampling
from daskhps.config import RunConfig
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.training.trainer import Trainer
from tests._runs import tiny_config

ROWS = 100_000  # the short log; the long one has 4x


def _logs(tmp: Path, name: str, rows: int, parts: int) -> Path:
    out = tmp / name
    cfg = GeneratorConfig(rows_per_day=rows, parts_per_day=parts, seed=3, vocab_scale=0.002)
    generate(cfg, str(out))
    return out


def _config(tmp: Path, logs: Path, name: str, address: str) -> RunConfig:
    d = tiny_config(
        tmp / name,
        logs,
        run={"seed": 2},
        data={"holdout": {"fraction": 0.25}, "block_size": "4MiB"},  # holdout > a chunk
        passes={"examples_per_pass": 25_000, "global_batch_size": 2500},
        eval={"batch_size": 2500},  # a full batch in both logs: memory follows the batch
        table={"tiers": {"device": {"rows": 20_000}, "host": {"fraction": 0.02}}},
    )
    d["cluster"] = {"address": address, "gpu": False}  # the test's own LocalCluster
    return RunConfig.from_dict(d, source=name)


def _peak_minus_table(client: Any, cfg: RunConfig) -> tuple[int, int]:
    """(peak RSS, table bytes) of the one worker while ``cfg`` trains."""
    client.run(start_sampling)
    try:
        result = Trainer(cfg, progress=False).run()
    finally:
        (peak,) = client.run(stop_sampling).values()
    table = max(max(p["tiers"]["table_bytes"]) for p in result.passes)
    return int(peak), int(table)


@pytest.mark.slow
def test_worker_memory_does_not_grow_with_the_log(tmp_path: Path) -> None:
    from distributed import Client, LocalCluster

    short = _logs(tmp_path, "short", ROWS, 1)
    long = _logs(tmp_path, "long", 4 * ROWS, 1)
    assert (next(long.rglob("*.tsv"))).stat().st_size > 8 * (4 << 20)  # many blocks
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            memory_limit="3GiB",
            dashboard_address=None,
            processes=True,
        ) as cluster,
        Client(cluster) as client,
    ):
        address = cluster.scheduler_address
        # Warm the worker (imports, the process group, the allocator) on the short log.
        warm = _logs(tmp_path, "warm", ROWS // 4, 1)
        Trainer(_config(tmp_path, warm, "warm-up", address), progress=False).run()
        peak1, table1 = _peak_minus_table(client, _config(tmp_path, short, "x1", address))
        peak4, table4 = _peak_minus_table(client, _config(tmp_path, long, "x4", address))
    rest1, rest4 = peak1 - table1, peak4 - table4
    print(
        f"1x: peak {peak1 >> 20} MiB, table {table1 >> 20} MiB; 4x: {peak4 >> 20}, {table4 >> 20}"
    )
    assert rest4 <= 1.10 * rest1, (rest1 >> 20, rest4 >> 20)

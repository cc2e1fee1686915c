"""On a real LocalCluster with 2 workers, every virtual shard's keys end on its owner."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster, wait

from daskhps.data import read_click_log
from daskhps.passes import PassConfig, build_plan, place_on_workers, plan_owner_keys
from daskhps.sharding import ShardMap


@pytest.mark.parametrize("shuffle_method", ["tasks", "p2p"])
def test_keys_land_on_their_owner(log_dir: Path, shuffle_method: str) -> None:
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        log = read_click_log(str(log_dir)).persist()
        cfg = PassConfig(
            examples_per_pass=12000,
            global_batch_size=1000,
            num_shards=32,
            shuffle_method=shuffle_method,
        )
        plan = build_plan(log, cfg, num_workers=2)
        shard_map = ShardMap(32, 2)
        owned = plan_owner_keys(log, plan, plan.passes[0], shard_map)
        placed = place_on_workers(client, owned)
        assert len(set(placed.addresses)) == 2
        wait(list(placed.futures))
        who = client.who_has(list(placed.futures))
        parts = client.gather(list(placed.futures))
        seen_shards: set[int] = set()
        for w, (fut, part) in enumerate(zip(placed.futures, parts, strict=True)):
            assert list(who[fut.key]) == [placed.addresses[w]]
            shards = set(part["shard"].tolist())
            assert shards <= set(shard_map.shards_of(w).tolist())
            assert (shard_map.worker(part["key"].to_numpy()) == w).all()
            seen_shards |= shards
        assert seen_shards == set(range(32))
        total = sum(len(p) for p in parts)
        frame = log.frame.compute()
        keys = frame[[f"C{i}" for i in range(1, 27)]].to_numpy()
        assert total == len(np.unique(keys))

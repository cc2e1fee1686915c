"""ShardMetrics on a run host's WorkerShards with real tables and zarr stores, on a stand-in
worker."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch
from prometheus_client import REGISTRY, generate_latest

from daskhps.distributed import RunHost, TierSizing, WorkerShards
from daskhps.monitor import metric_name
from daskhps.table import OptimizerSpec, TableSpec

SPEC = TableSpec("clicks", dim=4, optimizer=OptimizerSpec(kind="sgd"))
ADDRESS = "tcp://stand-in:1"


def _worker() -> SimpleNamespace:
    return SimpleNamespace(
        address=ADDRESS, memory_manager=SimpleNamespace(memory_limit=2**30), metrics={}
    )


def _run_host(path, device_rows: int) -> RunHost:
    shards = WorkerShards([SPEC], path, TierSizing(device_rows=device_rows, host_bytes=0))
    return RunHost("t", [ADDRESS], shards)


@pytest.fixture
def host(tmp_path):
    # 200 device rows and no host tier: staging 300 keys in two passes pushes rows to zarr.
    h = _run_host(tmp_path, 200)
    w = _worker()
    h.setup(w)
    assert h.shards is not None and h.monitor is not None
    h.shards.open()
    yield h.shards, w
    h.teardown(w)


def _value(worker: SimpleNamespace, figure: str) -> float:
    return worker.metrics[metric_name("clicks", figure)](worker)


def test_callbacks_show_tiers_staging_and_store_traffic(host):
    h, w = host
    assert h.monitor is not None
    h.monitor.refresh_s = h.monitor.store_refresh_s = 0.0  # refresh at every read here
    assert _value(w, "rows_staged") == 0 and w.metrics["daskhps_pass"](w) == -1

    keys = torch.arange(150)
    h.stage("clicks", keys)
    h.apply_gradients("clicks", keys, torch.ones(150, 4))  # dirty rows
    assert _value(w, "pinned_rows") == 150
    h.unpin("clicks")
    assert _value(w, "rows_staged") == 150 and _value(w, "pinned_rows") == 0
    assert _value(w, "hit_rate_init") == 1.0 and _value(w, "hit_rate_device") == 0.0
    assert _value(w, "rows_device") == 150 and _value(w, "bytes_device") > 0
    assert _value(w, "rows_store") == 0

    time.sleep(0.05)
    h.stage("clicks", torch.arange(100, 250))  # 50 found in the device tier, 100 new rows
    h.unpin("clicks")  # ... pushed 50 dirty rows down to zarr (no host tier)
    assert _value(w, "rows_store") == 50 and _value(w, "rows_device") == 200
    assert _value(w, "store_rows_written_per_s") > 0
    on_disk = h.tables["clicks"].store.keys()
    h.stage("clicks", on_disk)  # read back from zarr
    assert _value(w, "rows_staged") == 350 and _value(w, "pinned_rows") == 50
    # found in: device 50, store 50, none (init) 150 + 100
    assert _value(w, "hit_rate_device") == pytest.approx(50 / 350, abs=1e-4)
    assert _value(w, "hit_rate_store") == pytest.approx(50 / 350, abs=1e-4)
    assert _value(w, "hit_rate_init") == pytest.approx(250 / 350, abs=1e-4)
    assert _value(w, "store_rows_read_per_s") > 0 and _value(w, "bytes_store") > 0


def test_a_busy_table_keeps_its_last_figures_without_waiting(host):
    h, w = host
    h.monitor.refresh_s = 0.0
    h.stage("clicks", torch.arange(10))
    assert _value(w, "rows_device") == 10
    holding, release = threading.Event(), threading.Event()

    def train() -> None:
        with h.locked("clicks") as t:
            t.stage(torch.arange(10, 30))
            holding.set()
            release.wait(5)

    thread = threading.Thread(target=train)
    thread.start()
    holding.wait(5)
    try:
        t0 = time.perf_counter()
        assert _value(w, "rows_device") == 10  # the last snapshot, not the locked table
        assert time.perf_counter() - t0 < 0.1
    finally:
        release.set()
        thread.join()
    assert _value(w, "rows_device") == 30  # lock free again: refreshed


def test_refresh_is_rate_limited(host):
    h, w = host
    h.monitor.refresh_s = 60.0
    h.monitor.refresh(force=True)
    h.stage("clicks", torch.arange(10))
    assert _value(w, "rows_device") == 0  # not yet refreshed
    h.monitor.refresh(force=True)
    assert _value(w, "rows_device") == 10


def test_shard_stats_refresh_the_store_figures_at_once(host):
    h, w = host
    h.monitor.refresh_s = h.monitor.store_refresh_s = 60.0
    h.monitor.refresh(force=True)
    before = _value(w, "bytes_store")
    h.stage("clicks", torch.arange(100))
    h.apply_gradients("clicks", torch.arange(100), torch.ones(100, 4))
    h.commit("c1")  # the 100 dirty rows written to zarr
    assert _value(w, "bytes_store") == before  # the periodic refresh is not due
    h.stats()  # the trainer's per-pass shard_stats: the lock is held anyway
    assert _value(w, "bytes_store") > before and _value(w, "rows_store") == 100


def test_prometheus_lists_the_worker_then_forgets_it(tmp_path):
    h = _run_host(tmp_path, 100)
    w = _worker()
    h.setup(w)
    assert h.shards is not None and h.monitor is not None
    h.shards.open()
    h.shards.stage("clicks", torch.arange(20))
    h.monitor.refresh(force=True)
    text = generate_latest(REGISTRY).decode()
    assert f'daskhps_rows{{table="clicks",tier="device",worker="{ADDRESS}"}} 20.0' in text
    assert f'daskhps_rows_staged_total{{table="clicks",worker="{ADDRESS}"}} 20.0' in text
    # Registering the plugin again (same worker) replaces the series instead of failing.
    h2 = _run_host(tmp_path / "b", 100)
    h.teardown(w)
    h2.setup(w)
    assert metric_name("clicks", "rows_device") in w.metrics
    text = generate_latest(REGISTRY).decode()
    # one device series per family (hit rate, rows from, rows, bytes): no duplicates
    assert text.count(f'tier="device",worker="{ADDRESS}"') == 4
    assert f'daskhps_rows{{table="clicks",tier="device",worker="{ADDRESS}"}} 0.0' in text
    h2.teardown(w)
    assert not [k for k in w.metrics if k.startswith("daskhps_")]
    assert ADDRESS not in generate_latest(REGISTRY).decode()


def test_admitted_and_expired_rows_and_pending_keys_are_counted(tmp_path):
    """A shard with admission (min_count 2) and expiry (ttl 1 day): the Workers table and
    /metrics count the keys admitted, the rows expired and the keys waiting."""
    import pandas as pd

    from daskhps.table.admission import AdmissionRule
    from daskhps.table.expiry import ExpiryRule

    shards = WorkerShards(
        [SPEC],
        tmp_path,
        TierSizing(device_rows=500, host_bytes=0),
        admission=AdmissionRule(min_count=2),
        expiry=ExpiryRule(ttl_days=1),
    )
    h = RunHost("t", [ADDRESS], shards)
    w = _worker()
    h.setup(w)
    assert h.shards is not None
    h.shards.open()
    keys = torch.arange(100)
    day1 = pd.DataFrame({"key": keys.numpy(), "count": keys.numpy() % 2 + 1, "day": 700})
    h.shards.stage("clicks", keys)
    h.shards.admit("clicks", day1)  # the 50 odd keys occurred twice
    h.shards.record_seen("clicks", day1)
    h.shards.unpin("clicks")
    assert _value(w, "rows_admitted") == 50 and _value(w, "pending_keys") == 50
    h.shards.expire("clicks", 701)  # a day later, none seen on day 701
    assert _value(w, "rows_expired") == 50 and _value(w, "pending_keys") == 0
    text = generate_latest(REGISTRY).decode()
    assert f'daskhps_rows_admitted_total{{table="clicks",worker="{ADDRESS}"}} 50.0' in text
    assert f'daskhps_rows_expired_total{{table="clicks",worker="{ADDRESS}"}} 50.0' in text
    assert f'daskhps_pending_keys{{table="clicks",worker="{ADDRESS}"}} 0.0' in text
    h.teardown(w)


def test_several_tables_have_series_of_their_own(tmp_path):
    """A run of several tables: each table's figures are columns (and /metrics series) of
    their own, fed by the calls that split keys by table."""
    from daskhps.table import TableSpec

    small = TableSpec("small", dim=2)
    shards = WorkerShards(
        [SPEC, small], tmp_path, TierSizing(device_rows=100, host_bytes=0), tagged=True
    )
    h, w = RunHost("t", [ADDRESS], shards), _worker()
    h.setup(w)
    assert h.monitor is not None
    h.monitor.refresh_s = h.monitor.store_refresh_s = 0.0
    shards.open()
    keys = torch.cat([torch.arange(30), torch.arange(7) | (1 << 56)])
    shards.stage(None, keys)
    assert w.metrics[metric_name("clicks", "pinned_rows")](w) == 30
    assert w.metrics[metric_name("small", "pinned_rows")](w) == 7
    shards.unpin(None)
    assert w.metrics[metric_name("small", "rows_staged")](w) == 7
    h.teardown(w)

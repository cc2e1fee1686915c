"""The network record of a pass (daskhps.monitor.network): the least a pass needs from its keys'
owners, the shuffles' hops counted where their rows arrive, and the per-rank figures on the
dashboard and /metrics."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from prometheus_client import REGISTRY, generate_latest

from daskhps.distributed import RunHost, TierSizing, WorkerShards
from daskhps.monitor import network
from daskhps.monitor.network import (
    KINDS,
    SOURCE,
    PassKeys,
    RankTraffic,
    RouteAccount,
    account_shuffled,
    network_record,
    take_routed,
)
from daskhps.monitor.worker_metrics import announce_network
from daskhps.table import OptimizerSpec, TableSpec

ADDRESSES = ("tcp://a:1", "tcp://b:1", "tcp://c:1")


def _rank(sent: dict, received: dict, owners: list[int], **kw) -> RankTraffic:
    return RankTraffic(sent, received, owners, row_bytes=16, dense_bytes=100, batches=3, **kw)


def test_the_least_is_each_remote_unique_key_once_each_way() -> None:
    # owners[r][o]: the unique keys of rank r's examples that rank o owns
    ranks = [
        _rank({"keys": 200, "rows": 320, "grads": 640, "dense": 300}, {"rows": 800}, [5, 10, 0]),
        _rank({"keys": 100, "rows": 900}, {"rows": 100}, [4, 7, 1]),
        _rank({}, {}, [2, 0, 9]),
    ]
    rec = network_record(ranks)
    assert rec["ranks"] == 3 and rec["batches"] == 3
    asks = np.array([10, 5, 2])  # remote keys each rank uses
    serves = np.array([6, 10, 1])  # keys each rank serves to the others
    keys, rows, grads = rec["keys"], rec["rows"], rec["grads"]
    assert keys["rank_min_sent"] == (8 * asks).tolist()
    assert keys["rank_min_received"] == (8 * serves).tolist()
    assert rows["rank_min_sent"] == (16 * serves).tolist()
    assert rows["rank_min_received"] == (16 * asks).tolist()
    assert grads["rank_min_sent"] == rows["rank_min_received"]
    assert keys["min"] == 8 * 17 and rows["min"] == grads["min"] == 16 * 17
    assert rows["max_min"] == 16 * 10
    # measured: sums and the busiest rank, each direction; the ratio to the least
    assert rows["sent"] == 1220 and rows["received"] == 900
    assert rows["max_sent"] == 900 and rows["max_received"] == 800
    assert rows["ratio"] == round(1220 / (16 * 17), 4)
    # dense: a ring's 2 (n - 1) / n of the parameters' bytes each batch, each way
    ring = 3 * (2 * 2 * 100 // 3)
    assert rec["dense"]["rank_min_sent"] == [ring] * 3 and rec["dense"]["min"] == 3 * ring
    # nothing shuffled: zeros, and no ratio
    assert rec["examples"]["sent"] == 0 and rec["examples"]["ratio"] is None
    total = rec["total"]
    assert total["sent"] == sum(rec[k]["sent"] for k in KINDS)
    assert total["min"] == sum(rec[k]["min"] for k in KINDS)
    assert total["rank_sent"] == [sum(rec[k]["rank_sent"][r] for k in KINDS) for r in range(3)]


def test_the_pass_keys_are_the_batches_distinct_keys_by_owner() -> None:
    """Each batch's routed keys (unique, grouped by owner) count once over the pass, by the
    owner the routing gave them: the same as deduplicating every key of the pass at once."""
    from daskhps.distributed import Exchange
    from daskhps.sharding import ShardMap

    shard_map = ShardMap(16, 3)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 3000, (200, 5), generator=g) for _ in range(7)]
    seen = PassKeys()
    for b in batches:  # what Exchange.route gives on 3 ranks: unique keys grouped by owner
        uniq = torch.unique(b)
        owner = shard_map.worker(uniq)
        seen.add(
            uniq[torch.argsort(owner, stable=True)], torch.bincount(owner, minlength=3).tolist()
        )
    every = torch.unique(torch.cat([b.reshape(-1) for b in batches]))
    assert seen.by_owner(3) == torch.bincount(shard_map.worker(every), minlength=3).tolist()
    assert PassKeys().by_owner(2) == [0, 0]
    one = Exchange(None, ShardMap(4, 1)).route(batches[0])
    alone = PassKeys()
    alone.add(one.keys, one.send_counts)
    assert alone.by_owner(1) == [len(torch.unique(batches[0]))]


def test_one_rank_needs_and_sends_nothing() -> None:
    rec = network_record([_rank({}, {}, [40])])
    assert rec["total"]["sent"] == rec["total"]["min"] == 0
    assert rec["total"]["ratio"] is None


def _arrived(monkeypatch: pytest.MonkeyPatch, here: str, frame: pd.DataFrame, partition: int):
    monkeypatch.setattr(network, "_worker_address", lambda: here)
    account = RouteAccount("tok", 4, ADDRESSES)
    out = account_shuffled(account, "examples", frame, partition)
    assert SOURCE not in out.columns and len(out) == len(frame)
    return take_routed("tok", 4, here)["examples"]


def test_a_shuffle_counts_the_rows_from_other_ranks_and_the_copy_to_the_owner(monkeypatch):
    # 5 rows of 8 + 4 + 2 bytes (index, float32, the source rank) from ranks 0, 0, 1, 2, 2
    frame = pd.DataFrame(
        {"x": np.ones(5, np.float32), SOURCE: np.array([0, 0, 1, 2, 2], np.int16)},
        index=pd.Index(np.arange(5, dtype=np.int64)),
    )
    row = 14
    # Landed on its owner (rank 1): the rows of ranks 0 and 2 crossed once, and that is the
    # least too.
    hops, least = _arrived(monkeypatch, ADDRESSES[1], frame, partition=1)
    assert hops == least == [[0, 2 * row, 0], [0, 0, 0], [0, 2 * row, 0]]
    # Landed on rank 2 (p2p's choice), owned by rank 1: rows of ranks 0 and 1 to rank 2, then
    # the whole partition copied to rank 1.
    hops, least = _arrived(monkeypatch, ADDRESSES[2], frame, partition=1)
    assert hops == [[0, 0, 2 * row], [0, 0, row], [0, 5 * row, 0]]
    assert least == [[0, 2 * row, 0], [0, 0, 0], [0, 2 * row, 0]]
    assert take_routed("tok", 4, ADDRESSES[2]) == {}  # taken once


def test_binary_columns_count_their_values(monkeypatch):
    packed = pd.Series(
        pd.arrays.ArrowExtensionArray(pa.array([b"12345678", b"", None], pa.large_binary()))
    )
    frame = pd.DataFrame(
        {"bag": packed, SOURCE: np.array([0, 0, 2], np.int16)},
        index=pd.Index(np.arange(3, dtype=np.int64)),
    )
    hops, _ = _arrived(monkeypatch, ADDRESSES[1], frame, partition=1)
    fixed = 8 + 8 + 2  # index, the value's offset, the source rank
    assert hops[0][1] == 2 * fixed + 8 and hops[2][1] == fixed


def test_without_an_account_nothing_is_counted() -> None:
    frame = pd.DataFrame({"x": [1.0], SOURCE: np.array([1], np.int16)})
    assert list(account_shuffled(None, "examples", frame, 0).columns) == ["x"]
    plain = pd.DataFrame({"x": [1.0]})
    assert account_shuffled(None, "examples", plain, 0) is plain


def test_each_ranks_figures_reach_its_workers_table_and_metrics(tmp_path) -> None:
    """announce_network gives every worker its rank's figures of the pass: the Workers-table
    columns (summed over kinds) and /metrics series by kind and direction, the totals
    adding up pass after pass."""
    spec = TableSpec("clicks", dim=4, optimizer=OptimizerSpec(kind="sgd"))
    workers = [
        SimpleNamespace(address=a, memory_manager=SimpleNamespace(memory_limit=2**30), metrics={})
        for a in ADDRESSES[:2]
    ]
    hosts = []
    for r, w in enumerate(workers):
        shards = WorkerShards([spec], tmp_path / str(r), TierSizing(device_rows=16, host_bytes=0))
        h = RunHost("net", ADDRESSES[:2], shards)
        h.setup(w)
        hosts.append(h)

    class Client:  # client.run on every worker's event loop, as Dask does
        def run(self, fn, *args, workers, on_error):
            return {w.address: fn(*args, dask_worker=w) for w in workers_ if w.address in workers}

    workers_ = workers
    ranks = [
        _rank({"rows": 64, "keys": 8}, {"rows": 32}, [3, 4]),
        _rank({"rows": 32}, {"rows": 64, "keys": 8}, [2, 5]),
    ]
    rec = network_record(ranks)
    try:
        for _ in range(2):
            announce_network(Client(), list(ADDRESSES[:2]), rec)
        w0, w1 = workers
        assert w0.metrics["daskhps_network_sent_bytes"](w0) == rec["total"]["rank_sent"][0]
        assert w1.metrics["daskhps_network_received_bytes"](w1) == 72
        assert (
            w0.metrics["daskhps_network_min_received_bytes"](w0)
            == (rec["total"]["rank_min_received"][0])
        )
        text = generate_latest(REGISTRY).decode()
        a = ADDRESSES[0]
        assert (
            f'daskhps_network_pass_bytes{{direction="sent",kind="rows",worker="{a}"}} 64.0' in text
        )
        want = rec["rows"]["rank_min_sent"][0]
        assert (
            f'daskhps_network_pass_minimum_bytes{{direction="sent",kind="rows",worker="{a}"}} '
            f"{float(want)}" in text
        )
        assert (
            f'daskhps_network_bytes_total{{direction="sent",kind="rows",worker="{a}"}} 128.0'
            in text
        )
    finally:
        for h, w in zip(hosts, workers, strict=True):
            h.teardown(w)
    assert not [k for k in workers[0].metrics if k.startswith("daskhps_")]

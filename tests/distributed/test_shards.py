"""WorkerShards in a RunHost, and tier sizing, on a stand-in worker (no cluster needed)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.distributed import ClusterError, RunHost, TierSizing, WorkerShards
from daskhps.errors import CapacityError, ConfigError
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec
from daskhps.tier_sizing import KEYED_SHARE, MEMORY_BUDGET, PAUSE_FRACTION, row_cost, shares
from daskhps.tiers.host import rows_for_bytes
from daskhps.tiers.store import StoreOptions

SMALL = TableSpec("small", dim=4, optimizer=OptimizerSpec(kind="sgd"))
WIDE = TableSpec("wide", dim=16)  # adagrad: 32 floats a row
GiB = 2**30


def _worker(address: str = "tcp://w:1", limit: int | None = GiB) -> SimpleNamespace:
    return SimpleNamespace(address=address, memory_manager=SimpleNamespace(memory_limit=limit))


def _host(shards: WorkerShards, addresses: list[str], on: str) -> RunHost:
    """A run's host holding ``shards``, set up on the stand-in worker at ``on``."""
    host = RunHost("t", addresses, shards)
    host.setup(_worker(on))
    return host


def test_sizing_needs_one_device_budget():
    with pytest.raises(ConfigError, match="exactly one of device_fraction and device_rows"):
        TierSizing()
    with pytest.raises(ConfigError, match="exactly one"):
        TierSizing(device_fraction=0.1, device_rows=10)
    # A fraction's range is checked once, by the config (table.tiers); their sum here.
    with pytest.raises(ConfigError, match=r"= 1\.50 of the worker memory limit"):
        TierSizing(device_fraction=1.5).resolve([SMALL], GiB)


def test_sizing_stays_under_the_pause_threshold_on_cpu():
    with pytest.raises(ConfigError, match=r"Dask pauses a worker at 80%"):
        TierSizing(0.4, 0.4).resolve([SMALL], GiB)
    with pytest.raises(ConfigError, match="need a worker memory limit"):
        TierSizing(0.1).resolve([SMALL], None)
    assert MEMORY_BUDGET < PAUSE_FRACTION
    # Rows count too where the limit is known, at the price the tiers allocate them with;
    # on a GPU only the host tier is in the worker's memory.
    rows = int(MEMORY_BUDGET * GiB / row_cost(SMALL.width, "lru"))
    assert TierSizing(device_rows=rows).resolve([SMALL], GiB) == {"small": (rows, 0)}
    with pytest.raises(ConfigError, match=r"device\.rows \d+ \(0\.60 of memory_limit\)"):
        TierSizing(device_rows=rows + 1).resolve([SMALL], GiB)
    with pytest.raises(ConfigError, match=r"host_bytes \d+ \(0\.40"):
        TierSizing(device_rows=rows // 2, host_bytes=int(0.4 * GiB)).resolve([SMALL], GiB)
    assert TierSizing(device_rows=rows + 1).resolve([SMALL], None)  # no limit: not priced


def test_sizing_splits_fractions_by_row_size():
    got = TierSizing(0.2, 0.3).resolve([SMALL, WIDE], GiB)
    (rows_s, host_s), (rows_w, host_w) = got["small"], got["wide"]
    assert abs(rows_s - rows_w) / rows_w < 0.05  # about the same rows per table
    hrows = [rows_for_bytes(t.width, h) for t, h in ((SMALL, host_s), (WIDE, host_w))]
    assert abs(hrows[0] - hrows[1]) / hrows[1] < 0.05
    assert host_s + host_w <= 0.3 * GiB
    assert rows_s * SMALL.row_bytes + rows_w * WIDE.row_bytes <= 0.2 * GiB
    assert TierSizing(device_rows=100, host_bytes=5).resolve([SMALL], None) == {"small": (100, 5)}


def test_shards_open_per_rank_and_calls_take_the_lock(tmp_path):
    shards = WorkerShards([SMALL, WIDE], tmp_path, TierSizing(0.01, 0.01))
    host = _host(shards, ["tcp://w:0", "tcp://w:1"], "tcp://w:1")
    assert host.rank == 1 and shards.rank == 1
    opened = shards.open()
    assert opened["small"]["rank"] == 1 and opened["small"]["device_rows"] > 0
    assert (tmp_path / "small" / "rank-1").is_dir() and (tmp_path / "wide" / "rank-1").is_dir()

    # Staging waits while another thread (the training loop) holds the table.
    entered, times = threading.Event(), {}

    def train() -> None:
        with shards.locked("small"):
            entered.set()
            time.sleep(0.3)
            times["trained"] = time.monotonic()

    t = threading.Thread(target=train)
    t.start()
    entered.wait()
    report = shards.stage("small", torch.arange(50))
    times["staged"] = time.monotonic()
    t.join()
    assert times["staged"] >= times["trained"] and report.rows == 50

    rows = shards.lookup("small", torch.arange(3))
    shards.apply_gradients("small", torch.arange(3), torch.ones(3, 4))
    assert not torch.equal(shards.lookup("small", torch.arange(3), read_only=True), rows)
    stats = shards.stats()
    assert stats["rank"] == 1 and stats["tables"]["small"]["pinned"] == 50
    committed = shards.commit("c0")
    assert {t: c["name"] for t, c in committed.items()} == {"small": "c0", "wide": "c0"}
    assert committed["small"]["rows"] == 3 and committed["wide"]["rows"] == 0
    for t, c in committed.items():  # what identifies the commit: the store's own record
        (info,) = [i for i in shards.tables[t].commits() if i.name == "c0"]
        assert (c["seq"], c["time"]) == (info.seq, info.time)

    host.teardown(_worker("tcp://w:1"))
    host.close()  # twice is fine
    # The store's write lock was released: it reopens at the committed state.
    with EmbeddingTable.open(SMALL, tmp_path / "small" / "rank-1", device_rows=8) as t2:
        assert not torch.equal(t2.lookup(torch.arange(3), read_only=True), rows)


def test_worker_outside_the_ranks_holds_nothing(tmp_path):
    shards = WorkerShards([SMALL], tmp_path, TierSizing(device_rows=10))
    host = _host(shards, ["tcp://w:0"], "tcp://other:9")
    with pytest.raises(ClusterError, match="not one of the run's ranks"):
        shards.open()
    with pytest.raises(ClusterError, match="not one of the run's ranks"):
        host.require_rank()
    with pytest.raises(ClusterError, match="not open on rank None"):
        shards.lookup("small", torch.arange(2))
    with pytest.raises(ClusterError, match="not one of \\['small'\\]"):
        shards.lookup("nope", torch.arange(2))


def test_table_names_must_be_unique(tmp_path):
    with pytest.raises(ClusterError, match="unique"):
        WorkerShards([SMALL, SMALL], tmp_path, TierSizing(device_rows=1))


def _snapshot_commits(host: WorkerShards, table: str, commits: int) -> list[int]:
    """Which of ``commits`` commits (each updating a few rows) wrote a full index snapshot."""
    host.stage(table, torch.arange(100))
    out = []
    for i in range(commits):
        host.apply_gradients(table, torch.arange(i, i + 2), torch.ones(2, 4))
        host.commit(f"c{i}")
        with host.locked(table) as t:
            out += [i] if t.commits()[-1].snapshot else []
    return out


def test_stores_take_snapshot_every(tmp_path):
    default = WorkerShards([SMALL], tmp_path / "a", TierSizing(device_rows=200))
    every2 = WorkerShards(
        [SMALL], tmp_path / "b", TierSizing(device_rows=200), store=StoreOptions(snapshot_every=2)
    )
    got = []
    for shards in (default, every2):
        host = _host(shards, ["tcp://w:0"], "tcp://w:0")
        shards.open()
        try:
            got.append(_snapshot_commits(shards, "small", 8))
        finally:
            host.teardown(_worker("tcp://w:0"))
    assert got == [[7], [1, 3, 5, 7]]  # every 8th commit by default, every 2nd when asked


def _tagged(table: int, low: list[int]) -> torch.Tensor:
    return torch.tensor(low, dtype=torch.int64) | (table << 56)


def test_tagged_shards_send_each_key_to_its_table(tmp_path):
    """Keys of several tables in one call: each table gets its own keys, and the answers are
    those of the tables called one by one."""
    import pandas as pd

    from daskhps.table.admission import AdmissionRule
    from daskhps.table.expiry import ExpiryRule

    shards = WorkerShards(
        [SMALL, WIDE],
        tmp_path,
        TierSizing(device_rows=64, host_bytes=0),
        admission={"wide": AdmissionRule(min_count=2)},
        expiry={"small": ExpiryRule(max_rows=2)},
        tagged=True,
    )
    _host(shards, ["tcp://w:0"], "tcp://w:0")
    shards.open()
    small, wide = _tagged(0, [1, 2, 3]), _tagged(1, [1, 5])
    keys = torch.cat([wide[:1], small, wide[1:]])  # tables mixed in one batch
    part = pd.DataFrame({"key": keys.numpy(), "count": [1, 1, 1, 1, 2], "day": [0] * 5})
    assert [(n, list(p["key"])) for n, p in shards.split(part)] == [
        ("small", small.tolist()),
        ("wide", wide.tolist()),
    ]
    report = shards.stage(None, part)
    assert report.rows == 5 and report.initialised == 5
    # only wide has an admission rule: key 5 (seen twice) gets a row, wide's key 1 waits
    assert shards.admit(None, part) == {"admitted": 1, "held_back": 1}

    rows = shards.lookup_tagged(keys, WIDE.dim)
    assert rows.shape == (5, WIDE.dim)
    for i, k in enumerate(keys):
        name = "wide" if int(k) >> 56 else "small"
        own = shards.lookup(name, k.view(1))[0]
        assert torch.equal(rows[i, : len(own)], own)
        assert not rows[i, len(own) :].any()  # zeros beyond a narrower table's width

    grads = torch.ones(5, WIDE.dim)
    before = {n: shards.lookup(n, k) for n, k in (("small", small), ("wide", wide))}
    shards.apply_tagged(keys, grads)
    after_small = shards.lookup("small", small)
    # sgd at OptimizerSpec's default lr on a gradient of ones
    lr = SMALL.optimizer.lr
    assert torch.allclose(after_small, before["small"] - lr * torch.ones(3, SMALL.dim))
    after_wide = shards.lookup("wide", wide)
    assert torch.equal(after_wide[0], before["wide"][0])  # held back by admission: frozen
    assert not torch.equal(after_wide[1], before["wide"][1])

    shards.record_seen(None, part)
    assert shards.expire(None, 1) == {"expired": 1, "pending_expired": 0}  # small keeps 2
    assert shards.stats()["tables"]["wide"]["pending"]["keys"] == 1
    shards.unpin(None)
    shards.close(uncommitted="drop")


def test_untagged_shards_of_several_tables_need_a_name(tmp_path):
    shards = WorkerShards([SMALL, WIDE], tmp_path, TierSizing(device_rows=8, host_bytes=0))
    _host(shards, ["tcp://w:0"], "tcp://w:0")
    shards.open()
    with pytest.raises(ClusterError, match="untagged keys: name the table"):
        shards.stage(None, torch.tensor([1, 2]))
    shards.close(uncommitted="drop")


def test_a_table_with_budgets_of_its_own_takes_them_and_the_others_share_the_rest():
    from daskhps.tier_sizing import OwnBudget

    third = TableSpec("third", dim=4, optimizer=OptimizerSpec(kind="sgd"))
    own = (("wide", OwnBudget(device_rows=77, host_fraction=0.1, policy="lfu")),)
    got = TierSizing(0.2, 0.25, own=own).resolve([SMALL, WIDE, third], GiB)
    assert got["wide"] == (77, int(0.1 * GiB))
    alone = TierSizing(0.2, 0.25).resolve([SMALL, third], GiB)
    assert got["small"] == alone["small"] and got["third"] == alone["third"]  # WIDE is not in
    # what the memory check counts: the shared fractions and every own one
    with pytest.raises(ConfigError, match=r"wide's host\.fraction 0\.3"):
        TierSizing(0.2, 0.2, own=(("wide", OwnBudget(host_fraction=0.3)),)).resolve(
            [SMALL, WIDE], GiB
        )
    # a table with all its budgets its own leaves the run's budgets uncounted when alone
    both = (("wide", OwnBudget(device_fraction=0.1, host_fraction=0.1)),)
    assert TierSizing(0.5, 0.5, own=both).over_budget([WIDE], GiB, on_gpu=False) is None


def test_a_tables_own_policy_reaches_its_tiers(tmp_path):
    from daskhps.tier_sizing import OwnBudget

    sizing = TierSizing(device_rows=8, host_bytes=1 << 20, own=(("wide", OwnBudget(policy="lfu")),))
    shards = WorkerShards([SMALL, WIDE], tmp_path, sizing)
    _host(shards, ["tcp://w:0"], "tcp://w:0")
    shards.open()
    assert shards.tables["wide"].device_cache.policy == "lfu"
    assert shards.tables["small"].device_cache.policy == "lru"
    shards.close(uncommitted="drop")


def test_staging_ahead_stages_the_tables_that_fit_and_says_which_did_not(tmp_path):
    from daskhps.tier_sizing import OwnBudget

    sizing = TierSizing(device_rows=64, host_bytes=0, own=(("wide", OwnBudget(device_rows=4)),))
    shards = WorkerShards([SMALL, WIDE], tmp_path, sizing, tagged=True)
    _host(shards, ["tcp://w:0"], "tcp://w:0")
    shards.open()
    keys = torch.cat([_tagged(0, [1, 2, 3]), _tagged(1, list(range(10)))])
    ahead = shards.try_stage(None, keys)
    assert not ahead.fitted and ahead.refusal and "budgets of its own" in ahead.refusal
    assert ahead.refusal.startswith("table 'wide': ")
    # small's rows were fetched (and are pinned): the report says so, not the refusal alone
    assert ahead.report is not None and ahead.report.initialised == 3
    assert shards.try_stage(None, _tagged(0, [4])).fitted
    shards.close(uncommitted="drop")


@settings(max_examples=200, deadline=None)
@given(
    costs=st.lists(st.floats(8, 4096), min_size=1, max_size=6),
    keys=st.none() | st.lists(st.integers(0, 10**9), min_size=6, max_size=6),
)
def test_shares_give_every_table_rows_by_its_keys(costs, keys):
    """The model: rows_t proportional to KEYED_SHARE * keys_t / keys + (1 - KEYED_SHARE) / n
    (equal rows without keys, or when no table has a key); bytes = rows x a row's cost."""
    names = [f"t{i}" for i in range(len(costs))]
    cost = dict(zip(names, costs, strict=True))
    counts = None if keys is None else dict(zip(names, keys, strict=False))
    got = shares(cost, counts)
    assert set(got) == set(names) and abs(sum(got.values()) - 1.0) < 1e-9
    total = sum(counts.values()) if counts else 0
    n = len(names)
    want = {
        t: KEYED_SHARE * counts[t] / total + (1 - KEYED_SHARE) / n if total else 1.0 / n
        for t in names
    }
    rows = {t: got[t] / cost[t] for t in names}
    for a in names:
        assert got[a] > 0
        for b in names:
            assert rows[a] / rows[b] == pytest.approx(want[a] / want[b], rel=1e-9)


def test_tables_sharing_a_fraction_are_resized_by_the_first_pass_keys(tmp_path):
    """Equal rows would not hold the pass: small brings 9 keys in 10. Sized by the pass's
    keys, each table has the same room over its keys, and the pass fits; later passes keep
    the sizes (the tiers hold rows then)."""
    limit = 8 << 20
    sizing = TierSizing(0.05, 0.05)
    shards = WorkerShards([SMALL, WIDE], tmp_path, sizing, tagged=True)
    host = RunHost("t", ["tcp://w:0"], shards)
    host.setup(_worker("tcp://w:0", limit))
    opened = shards.open()
    equal = opened["small"]["device_rows"]
    assert abs(equal - opened["wide"]["device_rows"]) / equal < 0.01  # rows priced apiece
    n_small = int(equal * 1.5)  # more than its equal share
    n_wide = n_small // 9
    keys = torch.cat([_tagged(0, list(range(n_small))), _tagged(1, list(range(n_wide)))])
    assert shards.try_stage(None, keys).fitted
    got = {n: (t.device_cache.capacity_rows, t.host) for n, t in shards.tables.items()}
    assert got["small"][0] >= n_small and got["wide"][0] >= n_wide
    room = [got["small"][0] / n_small, got["wide"][0] / n_wide]
    assert room[0] < room[1]  # the floor of equal rows is wide's
    want = sizing.resolve([SMALL, WIDE], limit, keys={"small": n_small, "wide": n_wide})
    assert {n: g[0] for n, g in got.items()} == {n: w[0] for n, w in want.items()}
    spent = sum(got[t.name][0] * row_cost(t.width, "lru") for t in (SMALL, WIDE))
    assert 0.97 * 0.05 * limit <= spent <= 0.05 * limit  # the whole device budget, no more
    assert shards.split_by_keys(keys) is None  # once
    shards.unpin(None)
    shards.close(uncommitted="drop")


def test_tiers_that_hold_rows_are_not_resized(tmp_path):
    with EmbeddingTable.open(SMALL, tmp_path / "s", device_rows=8) as t:
        t.resize_caches(16, 0)  # empty: resized
        assert t.device_cache.capacity_rows >= 16
        t.lookup(torch.arange(3))
        with pytest.raises(CapacityError, match="hold 3 rows; they are resized only while"):
            t.resize_caches(32, 0)
        assert len(t.device_cache) == 3
        t.commit("c")

"""The serving lookup over real rank stores on disk: exact rows, caching, never a write,
refresh through deltas, and clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskhps.errors import (
    CommitNotFoundError,
    DataError,
    StoreMismatchError,
    StoreNotFoundError,
)
from daskhps.serve import ServingLookup, TableVersion, initial_rows
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec
from tests.serve.helpers import SPEC, bits, reference_rows, train_commit, tree_state, version

N = 3000


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """v1: N keys written; v2: 40 of them changed and 10 new keys written."""
    root = tmp_path_factory.mktemp("stores")
    gen = torch.Generator().manual_seed(1)
    keys = torch.randint(-(2**62), 2**62, (N + 10,), generator=gen).unique()
    train_commit(root, keys[:N], "v1", seed=1)
    changed = torch.cat([keys[:40], keys[N:]])
    train_commit(root, changed, "v2", seed=2)
    torch.save({"keys": keys, "changed": changed}, root / "keys.pt")
    return root


def _keys(stores: Path) -> dict[str, torch.Tensor]:
    return torch.load(stores / "keys.pt")


def test_rows_equal_the_tables_own_read_only_rows(stores: Path) -> None:
    v1 = version(stores, "v1")
    keys = _keys(stores)["keys"]
    unseen = torch.tensor([11, -5, 2**40], dtype=torch.int64)
    query = torch.cat([keys[:N], unseen, keys[:100]])  # duplicates too
    with ServingLookup(v1, device_rows=500, host_bytes=64 * 1024, full_rows=True) as lk:
        full = lk.lookup(query)
        stats = lk.stats()
        distinct = lk.lookup(keys, unique=True)  # a routed batch: no dedup
    with ServingLookup(v1, device_rows=500, host_bytes=64 * 1024) as lk:
        emb = lk.lookup(query)  # the embedding columns only, cached as such
        assert lk.device_cache.width == SPEC.dim < SPEC.width
    ref = reference_rows(v1, query)
    assert np.array_equal(bits(full), bits(ref))
    assert np.array_equal(bits(distinct), bits(reference_rows(v1, keys)))
    assert np.array_equal(bits(emb), bits(ref[:, : SPEC.dim]))
    assert full.shape == (len(query), SPEC.width) and emb.shape == (len(query), SPEC.dim)
    # unseen keys read their deterministic initial value
    assert np.array_equal(bits(full[N : N + 3]), bits(initial_rows(SPEC, unseen)))
    assert stats["rows_from"]["init"] == 3


def test_second_lookup_hits_the_caches_and_reads_no_store_row(stores: Path) -> None:
    keys = _keys(stores)["keys"][:400]
    with ServingLookup(version(stores, "v1"), device_rows=300, host_bytes=1 << 20) as lk:
        first = lk.lookup(keys)
        read = lk.stats()["store_rows_read"]
        second = lk.lookup(keys)
        stats = lk.stats()
    assert read == 400
    assert stats["store_rows_read"] == 400  # nothing more: 300 in the device cache, 100 host
    assert stats["rows_from"]["device"] == 300 and stats["rows_from"]["host"] == 100
    assert torch.equal(first, second)


def test_serving_never_writes_the_stores(stores: Path) -> None:
    before = tree_state(stores)
    keys = _keys(stores)["keys"]
    with ServingLookup(version(stores, "v1"), device_rows=64, host_bytes=8192) as lk:
        for part in keys.split(700):
            lk.lookup(part)
        lk.refresh(version(stores, "v2"))
        lk.lookup(keys)
    assert tree_state(stores) == before


@pytest.mark.parametrize("full_rows", [True, False], ids=["full-rows", "embeddings"])
def test_refresh_replaces_exactly_the_delta(stores: Path, full_rows: bool) -> None:
    """After refresh every key reads v2's row bit for bit, and only cached changed rows were
    read again."""
    k = _keys(stores)
    keys, changed = k["keys"], k["changed"]
    everything = torch.cat([keys, torch.tensor([123456789])])
    v1, v2 = version(stores, "v1"), version(stores, "v2")
    with ServingLookup(v1, device_rows=N + 100, full_rows=full_rows) as lk:
        lk.lookup(everything)  # caches every key (the 10 new ones as initial values)
        read_before = lk.stats()["store_rows_read"]
        report = lk.refresh(v2)
        assert report.changed_keys == len(changed) == 50
        assert report.replaced_rows == 50  # all of them were cached
        assert report.rows_read == 50 and report.how == "replay"
        assert lk.stats()["store_rows_read"] == read_before + 50
        after = lk.lookup(everything)
        assert lk.stats()["store_rows_read"] == read_before + 50  # served from the cache
    ref = reference_rows(v2, everything)[:, : after.shape[1]]
    assert after.shape[1] == (SPEC.width if full_rows else SPEC.dim)
    assert np.array_equal(bits(after), bits(ref))
    # the delta really changed rows (a no-op refresh would pass the check above too)
    assert not np.array_equal(bits(reference_rows(v1, changed)), bits(reference_rows(v2, changed)))


def test_refresh_reads_nothing_for_uncached_keys(stores: Path) -> None:
    keys = _keys(stores)["keys"]
    with ServingLookup(version(stores, "v1"), device_rows=100, full_rows=True) as lk:
        lk.lookup(keys[1000:1100])  # none of them changed in v2
        report = lk.refresh(version(stores, "v2"))
        assert (report.changed_keys, report.replaced_rows, report.rows_read) == (50, 0, 0)
        got = lk.lookup(keys[:60])
    assert np.array_equal(bits(got), bits(reference_rows(version(stores, "v2"), keys[:60])))


def test_refresh_to_a_branch_written_from_an_older_commit(tmp_path: Path) -> None:
    """v3 is written from v1 after v2 (a rollback): keys only v2 changed change back."""
    gen = torch.Generator().manual_seed(5)
    keys = torch.randint(-(2**62), 2**62, (600,), generator=gen)
    train_commit(tmp_path, keys, "v1", seed=1)
    train_commit(tmp_path, keys[:100], "v2", seed=2)
    train_commit(tmp_path, keys[50:60], "v3", seed=3, from_commit="v1")
    with ServingLookup(version(tmp_path, "v2"), device_rows=1000, full_rows=True) as lk:
        lk.lookup(keys)
        report = lk.refresh(version(tmp_path, "v3"))
        got = lk.lookup(keys)
    assert report.changed_keys == 100  # v2's 100 keys (v2-only segments) and v3's 10
    assert report.how == "diff"  # v3 does not extend v2: its index was opened
    assert np.array_equal(bits(got), bits(reference_rows(version(tmp_path, "v3"), keys)))


def test_refresh_across_a_compaction_replays_the_copies(tmp_path: Path) -> None:
    """A compaction rewrites live rows into new segments and drops the old ones: the delta
    holds the copies (same rows), and replaying them gives the compacted commit's state."""
    gen = torch.Generator().manual_seed(6)
    keys = torch.randint(-(2**62), 2**62, (800,), generator=gen)
    train_commit(tmp_path, keys, "v1", seed=1)
    with ServingLookup(version(tmp_path, "v1"), device_rows=1000, full_rows=True) as lk:
        lk.lookup(keys)
        for i in range(2, 5):  # rewrite most keys: the first segments go stale
            train_commit(tmp_path, keys[: 700 - 100 * i], f"v{i}", seed=i)
            assert lk.refresh(version(tmp_path, f"v{i}")).how == "replay"
        for r in range(2):
            with EmbeddingTable.open(SPEC, tmp_path / SPEC.name / f"rank-{r}", device_rows=10) as t:
                assert t.store.compact(min_stale=0.3).segments_rewritten > 0
                t.commit("compacted")
        report = lk.refresh(version(tmp_path, "compacted"))
        got = lk.lookup(keys)
    assert report.how == "replay" and report.changed_keys > 0
    assert np.array_equal(bits(got), bits(reference_rows(version(tmp_path, "compacted"), keys)))


def test_a_refresh_that_fails_on_one_rank_leaves_the_served_version(tmp_path: Path) -> None:
    """Rank 0 has the newer commit, rank 1 lacks it: the refresh fails and every key still
    reads the served version (rank 0, already advanced, is reopened at it)."""
    keys = torch.randint(-(2**62), 2**62, (300,), generator=torch.Generator().manual_seed(8))
    train_commit(tmp_path, keys, "v1", seed=1)
    owner = version(tmp_path, "v1").shard_map.worker(keys)
    with EmbeddingTable.open(SPEC, tmp_path / SPEC.name / "rank-0", device_rows=1000) as t:
        t.apply_gradients(keys[owner == 0], torch.ones(int((owner == 0).sum()), SPEC.dim))
        t.commit("v2")
    with ServingLookup(version(tmp_path, "v1"), device_rows=1000, full_rows=True) as lk:
        with pytest.raises(CommitNotFoundError, match=r"rank-1.*no commit 'v2'"):
            lk.refresh(version(tmp_path, "v2"))
        assert lk.version.commit == "v1"
        got = lk.lookup(keys)  # nothing cached: every row read from the stores
    assert np.array_equal(bits(got), bits(reference_rows(version(tmp_path, "v1"), keys)))
    rank0 = tmp_path / SPEC.name / "rank-0"
    with EmbeddingTable.open(SPEC, rank0, device_rows=1, mode="r", commit="v2") as t:
        newer = t.peek(keys[owner == 0])
    assert not np.array_equal(bits(got[owner == 0]), bits(newer))  # v2 really differs


def test_advance_is_for_readers(tmp_path: Path) -> None:
    train_commit(tmp_path, torch.arange(10), "v1", workers=1)
    path = tmp_path / SPEC.name / "rank-0"
    with (
        EmbeddingTable.open(SPEC, path, device_rows=10) as t,
        pytest.raises(DataError, match="advance is for readers"),
    ):
        t.store.advance("v1")


def test_refresh_to_another_sharding_empties_the_caches(stores: Path, tmp_path: Path) -> None:
    keys = _keys(stores)["keys"][:300]
    train_commit(tmp_path, keys, "one", workers=1, seed=9)
    one = version(tmp_path, "one", workers=1)
    with ServingLookup(version(stores, "v1"), device_rows=1000, full_rows=True) as lk:
        lk.lookup(keys)
        report = lk.refresh(one)
        assert report.how == "full" and report.replaced_rows == 0
        got = lk.lookup(keys)
    assert np.array_equal(bits(got), bits(reference_rows(one, keys)))


@pytest.fixture(scope="module")
def pool(stores: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys to draw from (N stored, 20 unseen) and their rows at v1."""
    keys = torch.cat([_keys(stores)["keys"][:N], torch.arange(20, dtype=torch.int64)])
    return keys, reference_rows(version(stores, "v1"), keys)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(st.lists(st.integers(0, N + 19), min_size=0, max_size=80), max_size=8),
    device_rows=st.integers(1, 40),
    host_rows=st.integers(0, 40),
)
def test_any_lookup_sequence_matches_the_stores(
    stores: Path,
    pool: tuple[torch.Tensor, torch.Tensor],
    batches: list[list[int]],
    device_rows: int,
    host_rows: int,
) -> None:
    """Tiny caches, arbitrary batches: every answer equals the committed row or init."""
    keys, ref = pool
    with ServingLookup(
        version(stores, "v1"), device_rows=device_rows, host_bytes=host_rows * 200, full_rows=True
    ) as lk:
        for b in batches:
            idx = torch.tensor(b, dtype=torch.int64)
            assert np.array_equal(bits(lk.lookup(keys[idx])), bits(ref[idx]))


def test_bad_inputs_raise_clear_errors(stores: Path, tmp_path: Path) -> None:
    with pytest.raises(CommitNotFoundError, match=r"no commit 'v9'.*available"):
        ServingLookup(version(stores, "v9"), device_rows=10)
    with pytest.raises(StoreNotFoundError, match="rank-0"):
        ServingLookup(version(tmp_path / "nothing", "v1"), device_rows=10)
    other = TableSpec("emb", 8, OptimizerSpec(kind="adagrad"), seed=7)
    with pytest.raises(StoreMismatchError, match="dim"):
        ServingLookup(TableVersion(stores, other, 2, 8, "v1"), device_rows=10)
    with (
        ServingLookup(version(stores, "v1"), device_rows=10) as lk,
        pytest.raises(DataError, match="int64"),
    ):
        lk.lookup(torch.tensor([1.0, 2.0]))


def test_a_batch_promised_unique_that_repeats_a_key_is_refused(stores: Path) -> None:
    keys = _keys(stores)["keys"][:5]
    with ServingLookup(version(stores, "v1"), device_rows=10) as lk:
        with pytest.raises(DataError, match=rf"unique=True.*key {int(keys[1])} more than once"):
            lk.lookup(torch.cat([keys, keys[1:2]]), unique=True)
        assert len(lk.device_cache) == 0  # refused before any row moved
        assert np.array_equal(bits(lk.lookup(keys, unique=True)), bits(lk.lookup(keys)))


@pytest.mark.gpu
def test_a_device_cache_on_the_gpu_returns_the_same_bits(stores: Path) -> None:
    keys = _keys(stores)["keys"]
    with ServingLookup(
        version(stores, "v1"), device_rows=200, host_bytes=16 << 10, device="cuda", full_rows=True
    ) as lk:
        got = lk.lookup(keys[:1000].cuda())
        assert got.device.type == "cuda"
        lk.refresh(version(stores, "v2"))
        after = lk.lookup(keys[:1000].cuda()).cpu()
    assert np.array_equal(bits(got.cpu()), bits(reference_rows(version(stores, "v1"), keys[:1000])))
    assert np.array_equal(bits(after), bits(reference_rows(version(stores, "v2"), keys[:1000])))


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["extend", "branch", "compact"]),
            st.lists(st.integers(0, 59), min_size=1, max_size=30, unique=True),
            st.integers(0, 10),
            st.lists(st.integers(0, 69), max_size=20, unique=True),  # looked up while prepared
            st.booleans(),  # prepared beside the lookups (a server's refresh) or in place
        ),
        min_size=1,
        max_size=5,
    ),
    cached=st.lists(st.integers(0, 69), max_size=70, unique=True),
)
def test_any_commit_history_refreshes_to_exact_rows(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple[str, list[int], int, list[int], bool]],
    cached: list[int],
) -> None:
    """Commits that extend, branch from an earlier commit, or compact; a lookup caching some
    keys follows them with refresh and must read every key (10 never written) exactly. A
    prepared refresh has more keys looked up (cached from the older stores) between its two
    halves, as a server's requests do."""
    root = tmp_path_factory.mktemp("history")
    universe = torch.arange(70, dtype=torch.int64) * 7919 - 100_000
    train_commit(root, universe[:60], "c0", seed=100)
    commits = ["c0"]
    with ServingLookup(version(root, "c0"), device_rows=40, host_bytes=4096, full_rows=True) as lk:
        for i, (kind, touched, pick, meanwhile, beside) in enumerate(steps, start=1):
            name = f"c{i}"
            if kind == "compact":
                for r in range(2):
                    path = root / SPEC.name / f"rank-{r}"
                    with EmbeddingTable.open(SPEC, path, device_rows=10) as t:
                        t.store.compact(min_stale=0.01)
                        t.commit(name)
            else:
                base = commits[pick % len(commits)] if kind == "branch" else None
                train_commit(root, universe[touched], name, seed=i, from_commit=base)
            commits.append(name)
            lk.lookup(universe[cached])
            if beside:
                prepared = lk.prepare(version(root, name))
                lk.lookup(universe[meanwhile])
                report = lk.refresh(prepared)
            else:
                report = lk.refresh(version(root, name))
            assert report.how in ("replay", "diff")
            got = lk.lookup(universe)
            assert np.array_equal(bits(got), bits(reference_rows(version(root, name), universe)))


def test_a_prepared_refresh_replaces_what_was_cached_meanwhile(stores: Path) -> None:
    """The server's refresh: prepared beside the lookups, finished between two of them."""
    k = _keys(stores)
    keys, changed = k["keys"], k["changed"]
    v1, v2 = version(stores, "v1"), version(stores, "v2")
    with ServingLookup(v1, device_rows=N + 100, full_rows=True) as lk:
        lk.lookup(keys[:20])  # half of the changed keys that v1 holds
        prepared = lk.prepare(v2)
        assert lk.version.commit == "v1" and len(prepared.changed) == len(changed) == 50
        lk.lookup(keys[20:1000])  # meanwhile: read from v1's stores, cached
        assert np.array_equal(bits(lk.lookup(keys[:40])), bits(reference_rows(v1, keys[:40])))
        report = lk.refresh(prepared)
        assert (report.how, report.changed_keys, report.replaced_rows) == ("diff", 50, 40)
        after = lk.lookup(keys)
    assert np.array_equal(bits(after), bits(reference_rows(v2, keys)))
    other = TableSpec("emb", 8, OptimizerSpec(kind="adagrad", lr=0.1), seed=7)
    with ServingLookup(v1, device_rows=10) as lk, pytest.raises(StoreMismatchError, match="layout"):
        lk.prepare(version(stores, "v2", spec=other))


@pytest.mark.parametrize("compact", [False, True], ids=["replay", "after-compaction"])
def test_refresh_to_a_version_that_removed_rows_serves_them_as_unseen(
    tmp_path: Path, compact: bool
) -> None:
    """Rows removed by expiry between two versions (deletion records in the stores): after a
    refresh, cached or not, they read their initial value; the rest read the new version's
    rows. Across a compaction the delta cannot be replayed: the lookup diffs the versions."""
    from daskhps.sharding import ShardMap
    from tests.serve.helpers import SHARDS

    keys = torch.arange(1000, 1400, dtype=torch.int64)
    train_commit(tmp_path, keys, "v1", seed=1)
    removed = keys[::3]
    owner = ShardMap(SHARDS, 2).worker(removed)
    for r in range(2):
        path = tmp_path / SPEC.name / f"rank-{r}"
        with EmbeddingTable.open(SPEC, path, device_rows=100_000) as t:
            assert t.remove(removed[owner == r]) == int((owner == r).sum())
            if compact:
                t.store.compact(min_stale=0.01)
            t.commit("v2")
    v1, v2 = version(tmp_path, "v1"), version(tmp_path, "v2")
    with ServingLookup(v1, device_rows=2000, full_rows=True) as lk:
        lk.lookup(keys)  # every row cached, the removed ones too
        report = lk.refresh(v2)
        # across the compaction the deletion records are gone: the segment sets are diffed
        assert report.how == ("diff" if compact else "replay")
        after = lk.lookup(keys)
    assert np.array_equal(bits(after), bits(reference_rows(v2, keys)))
    assert np.array_equal(bits(after[::3]), bits(initial_rows(SPEC, removed)))
    assert not np.array_equal(bits(reference_rows(v1, removed)), bits(initial_rows(SPEC, removed)))

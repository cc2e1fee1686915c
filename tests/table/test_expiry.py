"""Expiry (daskhps.table.expiry): the rule against a brute-force model, and a table's rows
read and removed across every tier (tiny tiers, so rows sit in the device tier, the host tier
and the store, some with stale copies below)."""

from __future__ import annotations

from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import torch
from hypothesis import given, settings

from daskhps.sharding import shard_of
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec
from daskhps.table.expiry import ExpiryRule
from daskhps.table.read_path import initial_rows
from daskhps.table.stats import NO_DAY, row_stats

SPEC = TableSpec("clicks", dim=4, optimizer=OptimizerSpec(kind="adagrad", lr=0.1), seed=1)

rows_strategy = st.lists(
    st.tuples(st.integers(0, 5), st.sampled_from([NO_DAY, 700, 701, 702, 703])),
    min_size=0,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(
    stats=rows_strategy,
    ttl=st.none() | st.integers(1, 4),
    max_rows=st.none() | st.integers(1, 40),
    score=st.sampled_from(["lfu", "lru"]),
    shards=st.integers(1, 5),
)
def test_the_rule_equals_a_brute_force_model(
    stats: list[tuple[int, int]], ttl: int | None, max_rows: int | None, score: str, shards: int
) -> None:
    keys = np.arange(len(stats), dtype=np.int64) * 7919 - 100
    counts = np.array([c for c, _ in stats], dtype=np.int64)
    days = np.array([d for _, d in stats], dtype=np.int64)
    rule = ExpiryRule(ttl, max_rows, score, shards)  # type: ignore[arg-type]
    got = rule.expired(keys, counts, days, today=703)

    want = set()
    for i, (_c, d) in enumerate(stats):
        if ttl is not None and d != NO_DAY and d <= 703 - ttl:
            want.add(i)
    if max_rows is not None:
        share = -(-max_rows // shards)
        shard = shard_of(keys, shards)
        for s in range(shards):
            alive = [i for i in range(len(stats)) if shard[i] == s and i not in want]
            if score == "lfu":
                alive.sort(key=lambda i: (stats[i][0], stats[i][1], keys[i]), reverse=True)
            else:
                alive.sort(key=lambda i: (stats[i][1], stats[i][0], keys[i]), reverse=True)
            want.update(alive[share:])
    assert set(np.flatnonzero(got).tolist()) == want


def _train(table: EmbeddingTable, keys: torch.Tensor, day: int) -> None:
    table.stage(keys)
    table.apply_gradients(keys, torch.ones(len(keys), SPEC.dim))
    table.record_seen(keys, days=day)
    table.unpin()


def test_rows_are_read_and_removed_in_every_tier(tmp_path: Path) -> None:
    """Rows spread over a device tier of 8 rows, a host tier of 8 and the store: their
    statistics read from the freshest copy; removing some leaves no trace in any tier, after
    a commit and a reopen too; a staged key is reset to its initial value and stays staged."""
    path = tmp_path / "store"
    model: dict[int, tuple[int, int]] = {}
    with EmbeddingTable.open(SPEC, path, device_rows=8, host_bytes=2000) as t:
        for day, keys in ((700, range(0, 20)), (701, range(10, 30)), (702, range(25, 32))):
            batch = torch.tensor(list(keys))
            for lo in range(0, len(batch), 6):
                _train(t, batch[lo : lo + 6], day)
            for k in keys:
                model[k] = (model.get(k, (0, 0))[0] + 1, day)
            t.flush()  # stale copies in the store: later rows of the same keys stay above
        assert len(t.device_cache) and t.host is not None and len(t.host)
        keys, count, last = t.row_statistics()
        got = {int(k): (int(c), int(d)) for k, c, d in zip(keys, count, last, strict=True)}
        assert got == model

        t.stage(torch.tensor([3, 4]))  # staged for a pass: reset to init, still pinned
        gone = torch.tensor([3, 4, 12, 26, 31, 999])
        assert t.remove(gone) == 5
        for k in gone.tolist():
            model.pop(k, None)
        keys, count, last = t.row_statistics()
        assert sorted(keys.tolist()) == sorted(model)
        assert torch.equal(t.peek(gone), initial_rows(SPEC, gone))
        assert t.device_cache.pinned_count == 2
        t.unpin()
        t.commit("c1")
    with EmbeddingTable.open(SPEC, path, device_rows=8, mode="r") as t:
        assert sorted(t.store.keys().tolist()) == sorted(model)
        assert torch.equal(t.peek(gone), initial_rows(SPEC, gone))
        c, d = row_stats(t.peek(torch.tensor(sorted(model))), SPEC.stats_at)
        assert list(zip(c.tolist(), d.tolist(), strict=True)) == [model[k] for k in sorted(model)]

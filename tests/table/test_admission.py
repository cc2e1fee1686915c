"""Admission (daskhps.table.admission): the pending counts against a dict model, the rule's
threshold, probability and determinism, and a table's frozen keys."""

from __future__ import annotations

import math
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, settings

from daskhps.errors import DataError
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec
from daskhps.table.admission import AdmissionRule, PendingCounts
from daskhps.table.stats import COUNT_MAX

KEYS = [-(2**63), -5, 0, 1, 7, 2**40, 2**63 - 1]

ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "pop"]),
        st.lists(st.sampled_from(KEYS), unique=True, max_size=len(KEYS)),
        st.integers(0, 2**31),  # counts (one for the whole call: saturation is reached)
        st.integers(0, 800_000),  # a day
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops)
def test_pending_counts_equal_a_dict_model(ops: list[tuple[str, list[int], int, int]]) -> None:
    pending = PendingCounts()
    model: dict[int, tuple[int, int]] = {}
    for op, keys, count, day in ops:
        arr = np.array(keys, dtype=np.int64)
        if op == "add":
            counts = np.full(len(keys), count, np.int64)
            pending.add(arr, counts, day)
            for k in keys:
                c, d = model.get(k, (0, 0))
                model[k] = (min(c + count, COUNT_MAX), max(d, day))
        else:
            got = pending.pop(arr)
            assert got.tolist() == [model.pop(k, (0, 0))[0] for k in keys]
        assert pending.keys.tolist() == sorted(model)
        assert [tuple(s) for s in pending.stats.tolist()] == [model[k] for k in sorted(model)]
        assert pending.counts(np.array(KEYS)).tolist() == [model.get(k, (0, 0))[0] for k in KEYS]
        assert pending.nbytes == PendingCounts.BYTES_PER_KEY * len(model)
    back = PendingCounts.from_arrays(*pending.arrays().values())
    assert back.keys.tolist() == pending.keys.tolist()
    assert back.stats.tolist() == pending.stats.tolist()


def test_pending_counts_refuse_unsorted_keys() -> None:
    with pytest.raises(ValueError, match="sorted unique keys"):
        PendingCounts(np.array([2, 1]), np.zeros((2, 2), np.int32))
    assert len(PendingCounts.from_arrays(None, None)) == 0


def test_the_threshold_admits_in_the_pass_the_count_reaches_it() -> None:
    rule = AdmissionRule(min_count=3)
    keys = np.arange(6)
    prior = np.array([0, 0, 1, 2, 2, 5])
    seen = np.array([1, 3, 1, 1, 0, 1])
    assert rule.admitted(keys, prior, seen).tolist() == [False, True, False, True, False, True]
    assert AdmissionRule().admits_all and not rule.admits_all
    assert not AdmissionRule(probability=0.5).admits_all


def test_the_probability_is_per_occurrence_and_deterministic() -> None:
    """Over many keys, a pass of k eligible occurrences admits 1 - (1 - p)**k of them; the
    same (seed, key, prior) always decides the same, another prior decides anew."""
    n = 200_000
    keys = np.arange(n, dtype=np.int64) * 7919
    rule = AdmissionRule(min_count=2, probability=0.25, seed=3)
    for prior, seen, eligible in ((0, 1, 0), (0, 2, 1), (1, 3, 3), (4, 2, 2)):
        got = rule.admitted(keys, np.full(n, prior), np.full(n, seen))
        want = 1 - (1 - 0.25) ** eligible
        assert abs(got.mean() - want) < 5 * math.sqrt(want * (1 - want) / n) + 1e-12
        assert np.array_equal(got, rule.admitted(keys, np.full(n, prior), np.full(n, seen)))
    a = rule.admitted(keys, np.full(n, 1), np.full(n, 1))
    b = rule.admitted(keys, np.full(n, 2), np.full(n, 1))
    assert 0.15 < (a != b).mean() < 0.5  # a new draw per pass, independent of the last
    other = AdmissionRule(min_count=2, probability=0.25, seed=4)
    assert not np.array_equal(a, other.admitted(keys, np.full(n, 1), np.full(n, 1)))
    u = rule.draw(keys, np.zeros(n, np.int64))
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.01


def test_frozen_keys_read_their_initial_value_and_take_no_update(tmp_path: Path) -> None:
    """Keys with rows: in the store, or changed in the device tier; the rest have none.
    A frozen key's gradient is dropped (it reads init), until thaw."""
    spec = TableSpec("clicks", dim=4, optimizer=OptimizerSpec(kind="adagrad", lr=0.1), seed=1)
    keys = torch.arange(1, 7, dtype=torch.int64)
    with EmbeddingTable.open(spec, tmp_path / "store", device_rows=64) as t:
        t.apply_gradients(keys[:2], torch.ones(2, 4))
        t.commit("c0")
        t.unpin()
    with EmbeddingTable.open(spec, tmp_path / "store", device_rows=64) as t:
        t.stage(keys)
        t.apply_gradients(keys[2:3], torch.ones(1, 4))  # key 3: changed, not in the store
        assert t.without_rows(keys).tolist() == [False, False, False, True, True, True]
        init = t.peek(keys)
        t.freeze(keys[3:5])
        t.apply_gradients(torch.cat([keys, keys]), torch.ones(12, 4))
        after = t.peek(keys)
        assert torch.equal(after[3:5], init[3:5])  # keys 4 and 5: no update
        assert not bool((after[[0, 1, 2, 5]] == init[[0, 1, 2, 5]]).all(dim=1).any())
        t.thaw()
        t.apply_gradients(keys[3:4], torch.ones(1, 4))
        assert not torch.equal(t.peek(keys[3:4]), init[3:4])
        with pytest.raises(DataError, match="key 99 is not staged"):
            t.freeze(torch.tensor([99]))

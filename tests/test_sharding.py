"""Owner routing: numpy, pandas and torch agree bit for bit; shard maps are balanced."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.errors import ConfigError
from daskhps.sharding import ShardMap, assign_shards, mix, shard_of

KEYS = np.array([0, 1, -1, 2**62, 7577068805331155706, -(2**63)], dtype=np.int64)
# Computed once; the shuffle and the training loop of every release must agree with them.
GOLDEN_MIX = [
    6425684677977575103,
    5288234970396370071,
    2436632044080904116,
    5107547890775079990,
    3012997575160341280,
    1841208529771402598,
]
GOLDEN_SHARD_64 = [63, 23, 52, 54, 32, 38]


def test_golden() -> None:
    assert mix(KEYS).tolist() == GOLDEN_MIX
    assert shard_of(KEYS, 64).tolist() == GOLDEN_SHARD_64
    assert mix(torch.from_numpy(KEYS)).tolist() == GOLDEN_MIX


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=200),
    st.integers(1, 5000),
    st.integers(1, 16),
)
def test_numpy_pandas_torch_agree(keys: list[int], num_shards: int, workers: int) -> None:
    a = np.array(keys, dtype=np.int64)
    want = shard_of(a, num_shards)
    assert ((want >= 0) & (want < num_shards)).all()
    assert shard_of(torch.tensor(a), num_shards).numpy().tolist() == want.tolist()
    s = pd.Series(a, index=np.arange(len(a)) + 3)
    got = shard_of(s, num_shards)
    assert got.tolist() == want.tolist() and list(got.index) == list(s.index)
    if workers <= num_shards:
        m = ShardMap(num_shards, workers)
        w = m.worker(a)
        assert w.tolist() == m.worker_of_shard[want].tolist()
        assert m.worker(torch.tensor(a)).tolist() == w.tolist()


def test_shard_map_balanced_contiguous() -> None:
    owner = assign_shards(10, 3)
    assert owner.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    counts = np.bincount(assign_shards(1000, 7))
    assert counts.max() - counts.min() <= 1
    m = ShardMap(8, 2)
    assert m.shards_of(1).tolist() == [4, 5, 6, 7]


def test_keys_spread_evenly() -> None:
    keys = np.arange(200_000, dtype=np.int64)  # worst case for a plain modulo of raw keys
    counts = np.bincount(shard_of(keys, 64), minlength=64)
    assert counts.min() > 0.9 * counts.mean()


def test_bad_shard_maps() -> None:
    with pytest.raises(ConfigError, match="num_shards"):
        ShardMap(2, 3)
    with pytest.raises(ConfigError):
        shard_of(KEYS, 0)

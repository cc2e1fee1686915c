"""The one splitmix64 finaliser (daskhps._mix64) equals its definition on Python integers, in
every variant and array library, and so do the four callers built on it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps._mix64 import M1, M2, fmix64_numpy, fmix64_torch, fmix64_torch_, s64
from daskhps.data.hashing import fmix64 as hashing_fmix64
from daskhps.sharding import SHARD_SALT, mix
from daskhps.table.init import mix64 as init_mix64
from daskhps.tiers.index import _SEED, _home

_MASK = (1 << 64) - 1

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

u64s = st.lists(st.integers(0, _MASK), min_size=1, max_size=40)


def _reference(x: int, final: bool = True) -> int:
    """The finaliser written out on Python integers mod 2**64."""
    x &= _MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    if final:
        x ^= x >> 31
    return x


def _as_int64(xs: list[int]) -> list[int]:
    return [s64(x) for x in xs]


def test_constants_and_s64() -> None:
    assert (M1, M2) == (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
    assert [s64(x) for x in (0, 2**63 - 1, 2**63, _MASK, -1)] == [0, 2**63 - 1, -(2**63), -1, -1]


@settings(max_examples=100, deadline=None)
@given(xs=u64s, final=st.booleans())
def test_numpy_matches_reference(xs: list[int], final: bool) -> None:
    x = np.array(xs, dtype=np.uint64)
    before = x.copy()
    assert fmix64_numpy(x, final=final).tolist() == [_reference(v, final) for v in xs]
    assert np.array_equal(x, before)  # the input is left alone


@settings(max_examples=30, deadline=None)
@given(xs=u64s, final=st.booleans())
def test_cupy_matches_reference(xs: list[int], final: bool) -> None:
    cupy = pytest.importorskip("cupy")
    x = cupy.asarray(np.array(xs, dtype=np.uint64))
    assert fmix64_numpy(x, cupy, final=final).get().tolist() == [_reference(v, final) for v in xs]


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=100, deadline=None)
@given(xs=u64s, final=st.booleans(), with_tmp=st.booleans())
def test_torch_matches_reference(device: str, xs: list[int], final: bool, with_tmp: bool) -> None:
    want = _as_int64([_reference(v, final) for v in xs])
    x = torch.tensor(_as_int64(xs), dtype=torch.int64, device=device)
    before = x.clone()
    assert fmix64_torch(x, final=final).tolist() == want
    assert torch.equal(x, before)  # the copying form leaves its input alone
    tmp = torch.empty_like(x) if with_tmp else None
    z = x.clone()
    assert fmix64_torch_(z, final=final, tmp=tmp) is z  # the in-place form writes into z
    assert z.tolist() == want


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=100, deadline=None)
@given(xs=u64s, buckets=st.integers(1, 2**31))
def test_callers_match_reference(device: str, xs: list[int], buckets: int) -> None:
    """Each caller's variant over the shared finaliser, against its definition."""
    keys = torch.tensor(_as_int64(xs), dtype=torch.int64, device=device)
    # data.hashing: numpy uint64, unshifted.
    assert hashing_fmix64(np.array(xs, dtype=np.uint64)).tolist() == [_reference(v) for v in xs]
    # sharding: key XOR salt, masked to 63 bits; numpy, pandas and torch agree.
    routed = [_reference(v ^ SHARD_SALT) & ((1 << 63) - 1) for v in xs]
    assert mix(np.array(_as_int64(xs), dtype=np.int64)).tolist() == routed
    assert mix(pd.Series(_as_int64(xs), dtype="int64")).tolist() == routed
    assert mix(keys).tolist() == routed
    # table.init: torch int64, unmasked.
    assert init_mix64(keys).tolist() == _as_int64([_reference(v) for v in xs])
    # tiers.index: top 32 bits of the finaliser (without its last step) of key XOR seed,
    # scaled to the bucket count; with and without caller-owned buffers.
    homes = [((_reference(v ^ _SEED, final=False) >> 32) * buckets) >> 32 for v in xs]
    assert _home(keys, buckets).tolist() == homes
    out, tmp = torch.empty_like(keys), torch.empty_like(keys)
    assert _home(keys, buckets, out=out, tmp=tmp).tolist() == homes


def test_imports_neither_dask_nor_torch() -> None:
    """tiers, table and sharding use this module: it must not pull dask in, and the numpy-only
    data pipeline must not pay for importing torch."""
    code = (
        "import sys, daskhps._mix64; "
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'dask', 'distributed', 'torch'}); "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

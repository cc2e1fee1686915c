"""A tier's memory follows the rows it holds, not its capacity (``reserve_zeros``)."""

from __future__ import annotations

import resource

import torch

from daskhps.tiers._slots import SlotCache
from daskhps.tiers.reserve import reserve_zeros


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_opening_a_large_cache_touches_almost_none_of_its_memory() -> None:
    rows, width = 2_000_000, 32  # 256 MiB of slab, 16 MiB per int64 column
    before = _faults()
    cache = SlotCache("t/host", width, rows)
    opened = _faults() - before
    assert opened < 2_000, f"opening touched {opened} pages of a {rows}-row cache"
    keys = torch.arange(1, 10_001, dtype=torch.int64) * 7919
    rows_in = torch.randn(keys.numel(), width)
    before = _faults()
    cache.upsert(keys, rows_in)
    filled = _faults() - before
    # 10k rows are 1.3 MiB of slab: a few hundred pages, not the 70k pages of the capacity.
    assert filled < 5_000, f"inserting 10k rows touched {filled} pages"
    got = cache.lookup(keys)
    assert got.found.all() and torch.equal(got.rows, rows_in)
    assert torch.equal(cache.lookup(torch.tensor([3])).rows, torch.zeros(1, width))


def test_reserved_zeros_are_zero_writable_and_typed() -> None:
    for dtype in (torch.float32, torch.int64, torch.bool, torch.int32):
        t = reserve_zeros(600_000, 3, dtype=dtype, device=torch.device("cpu"))
        assert t.dtype == dtype and t.shape == (600_000, 3) and t.is_contiguous()
        assert not t.any()
        t[123_456] = 1
        assert int(t.sum()) == 3 and bool(t[123_456].all())
    small = reserve_zeros(4, dtype=torch.int64, device=torch.device("cpu"))
    assert small.tolist() == [0, 0, 0, 0]


def test_a_full_cache_s_index_is_the_size_capacity_plans_price() -> None:
    from daskhps.tiers.index import KeyIndex

    rows = 300_000  # grown from a small start, past several doublings
    cache = SlotCache("t/device", 4, rows)
    keys = torch.randperm(10 * rows)[:rows].add_(1)
    for chunk in keys.split(70_000):
        cache.upsert(chunk, torch.zeros(chunk.numel(), 4))
    assert len(cache) == rows
    assert cache.stats.extra["index_bytes"] == KeyIndex.nbytes_for(rows)
    got = cache.lookup(keys)
    assert got.found.all()

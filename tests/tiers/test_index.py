"""KeyIndex against a plain dict: extreme keys, collisions, growth, deletes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from daskhps.tiers import index
from daskhps.tiers.index import _PAIRS, KeyIndex, _home
from tests.tiers.conformance import DEVICES

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
EXTREMES = [I64_MIN, I64_MIN + 1, -1, 0, 1, I64_MAX - 1, I64_MAX]


def t(xs: list[int], device: str = "cpu") -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64, device=device)


def check(ix: KeyIndex, model: dict[int, int], probe: list[int]) -> None:
    device = ix.device
    keys = t(sorted(set(probe) | set(model)), device)
    values, found = ix.get(keys)
    assert values.dtype == torch.int64 and found.dtype == torch.bool
    for k, v, f in zip(keys.tolist(), values.tolist(), found.tolist(), strict=True):
        assert f == (k in model), k
        assert v == model.get(k, -1), k
    assert len(ix) == len(model)
    ks, vs = ix.items()
    assert dict(zip(ks.tolist(), vs.tolist(), strict=True)) == model


def colliding_keys(ix: KeyIndex, n: int, seed: int = 0) -> torch.Tensor:
    """``n`` distinct keys sharing one home bucket in ``ix``'s current table."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.randint(I64_MIN, I64_MAX, (200_000,), generator=g).unique()
    home = _home(pool.to(ix.device), ix._buckets).cpu()
    target = int(torch.bincount(home).argmax())
    keys = pool[home == target]
    while keys.numel() < n:  # neighbours of colliding keys, filtered to the same home
        keys = torch.cat([keys, keys + 1]).unique()
        keys = keys[_home(keys.to(ix.device), ix._buckets).cpu() == target]
    return keys[:n].to(ix.device)


@pytest.mark.parametrize("device", DEVICES)
def test_extreme_keys(device: str) -> None:
    ix = KeyIndex(4, device=device)
    values = t([10, 11, 12, 13, 14, 15, 16], device)
    _, found = ix.get(t(EXTREMES, device))
    assert not found.any()  # the empty-slot marker must not match a missing key
    ix.put(t(EXTREMES, device), values)
    check(ix, dict(zip(EXTREMES, values.tolist(), strict=True)), [2, 3])
    found = ix.delete(t([I64_MIN, 0, 5], device))
    assert found.tolist() == [True, True, False]
    check(
        ix,
        {k: v for k, v in zip(EXTREMES, values.tolist(), strict=True) if k not in (I64_MIN, 0)},
        [],
    )
    ix.put(t([I64_MIN], device), t([-7], device))
    assert ix.get(t([I64_MIN], device))[0].tolist() == [-7]


@pytest.mark.parametrize("device", DEVICES)
def test_colliding_batch_spills_and_unspills(device: str) -> None:
    ix = KeyIndex(1024, device=device)
    keys = colliding_keys(ix, 5 * _PAIRS)  # four buckets' worth aimed at one bucket
    ix.put(keys, torch.arange(keys.numel(), device=device))
    assert int(ix._spill.sum()) > 0
    model = dict(zip(keys.tolist(), range(keys.numel()), strict=True))
    check(ix, model, [0, 1])
    gone = keys[::3]
    assert ix.delete(gone).all()
    for k in gone.tolist():
        del model[k]
    check(ix, model, gone.tolist())
    ix.delete(keys)
    assert len(ix) == 0 and int(ix._spill.sum()) == 0  # counts return to zero: no tombstones


def test_growth_keeps_load_and_contents() -> None:
    ix = KeyIndex(1)
    keys = torch.randperm(50_000) * 7919 - 123_456
    for part in keys.split(4096):
        ix.put(part, part * 2)
        assert ix.load <= ix.load_factor
    values, found = ix.get(keys)
    assert found.all() and torch.equal(values, keys * 2)


def test_large_batches_go_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "PROBE_CHUNK", 100)
    ix = KeyIndex(10)
    keys = torch.randperm(1000) - 500
    ix.put(keys, keys * 3)
    values, found = ix.get(torch.cat([keys, keys + 10_000]))
    assert found[:1000].all() and not found[1000:].any()
    assert torch.equal(values[:1000], keys * 3)
    assert ix.delete(keys[::2]).all() and len(ix) == 500
    small = KeyIndex(10)
    small.get(keys[:100])
    assert ix.scratch_bytes == small.scratch_bytes  # sized by the chunk, not the batch
    # puts go in chunks too: overwrites and new keys mixed, and a promised-absent batch
    more = torch.cat([keys[1::2], torch.arange(600) + 20_000])
    ix.put(more, more * 5)
    fresh = torch.arange(700) + 90_000
    ix.put(fresh, fresh * 7, absent=True)
    values, found = ix.get(torch.cat([more, fresh]))
    assert found.all() and torch.equal(values, torch.cat([more * 5, fresh * 7]))
    assert len(ix) == 500 + 600 + 700 and ix.load <= ix.load_factor


def test_put_absent_skips_the_lookup() -> None:
    ix = KeyIndex(8)
    ix.put(t([1, I64_MIN]), t([10, 11]), absent=True)
    ix.put(t([2, 3]), t([20, 30]), absent=True)
    values, found = ix.get(t([1, 2, 3, I64_MIN, 4]))
    assert found.tolist() == [True, True, True, True, False]
    assert values.tolist() == [10, 20, 30, 11, -1] and len(ix) == 4


def test_overwrite_and_default() -> None:
    ix = KeyIndex(8)
    ix.put(t([1, 2, 3]), t([10, 20, 30]))
    ix.put(t([2, 4]), t([21, 40]))
    values, found = ix.get(t([1, 2, 3, 4, 5]), default=99)
    assert values.tolist() == [10, 21, 30, 40, 99]
    assert found.tolist() == [True, True, True, True, False]
    assert len(ix) == 4


def test_empty_batches_and_clear() -> None:
    ix = KeyIndex(8)
    e = t([])
    ix.put(e, e)
    assert ix.get(e)[0].numel() == 0 and ix.delete(e).numel() == 0
    ix.put(t([I64_MIN, 5]), t([1, 2]))
    ix.clear()
    assert len(ix) == 0 and ix.items()[0].numel() == 0
    assert not ix.get(t([I64_MIN, 5]))[1].any()


def test_sizes() -> None:
    ix = KeyIndex(1000, load_factor=0.5)
    assert ix.slots >= 2000 and ix.nbytes == KeyIndex.nbytes_for(1000, 0.5)
    ix.put(torch.arange(500), torch.arange(500))
    assert ix.load == 500 / ix.slots


def test_spare_buckets_running_out_grows_the_table() -> None:
    ix = KeyIndex(1 << 12)
    last = ix._buckets - 1  # keys homed in the last bucket spill into the padding
    pool = torch.randint(I64_MIN, I64_MAX, (2_000_000,), generator=torch.Generator().manual_seed(1))
    keys = pool[_home(pool, ix._buckets) == last][: 20 * _PAIRS]
    assert keys.numel() == 20 * _PAIRS  # more than the spare buckets hold
    ix.put(keys, keys)
    values, found = ix.get(keys)
    assert found.all() and torch.equal(values, keys)


key = st.one_of(st.integers(I64_MIN, I64_MAX), st.sampled_from(EXTREMES), st.integers(-40, 40))
batch = st.lists(key, unique=True, max_size=80)


class IndexMachine(RuleBasedStateMachine):
    """Random puts, deletes, gets and clears against a dict; small tables force collisions."""

    def __init__(self) -> None:
        super().__init__()
        self.ix = KeyIndex(2)
        self.model: dict[int, int] = {}

    @rule(keys=batch, data=st.data())
    def put(self, keys: list[int], data: st.DataObject) -> None:
        values = data.draw(
            st.lists(st.integers(I64_MIN, I64_MAX), min_size=len(keys), max_size=len(keys))
        )
        self.ix.put(t(keys), t(values))
        self.model.update(zip(keys, values, strict=True))

    @precondition(lambda self: self.model)
    @rule(data=st.data(), extra=batch)
    def delete(self, data: st.DataObject, extra: list[int]) -> None:
        present = data.draw(st.lists(st.sampled_from(sorted(self.model)), unique=True))
        keys = list(dict.fromkeys(present + extra))
        found = self.ix.delete(t(keys))
        assert found.tolist() == [k in self.model for k in keys]
        for k in keys:
            self.model.pop(k, None)

    @rule(keys=batch)
    def get(self, keys: list[int]) -> None:
        values, found = self.ix.get(t(keys))
        assert found.tolist() == [k in self.model for k in keys]
        assert values.tolist() == [self.model.get(k, -1) for k in keys]

    @rule()
    def clear(self) -> None:
        self.ix.clear()
        self.model.clear()

    @invariant()
    def same_contents(self) -> None:
        assert len(self.ix) == len(self.model)
        ks, vs = self.ix.items()
        assert dict(zip(ks.tolist(), vs.tolist(), strict=True)) == self.model


IndexMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestIndexMachine = IndexMachine.TestCase

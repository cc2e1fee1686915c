"""One conformance suite that every tier passes, and what caches pass on top.

A backend's test module subclasses :class:`TierConformance` (the persistent store) or
:class:`CacheConformance` (a cache) and supplies the ``make_tier`` fixture: a factory
``make_tier(width, capacity_rows) -> Tier``. Persistent tiers ignore ``capacity_rows``. The
same tests then run against every backend, as zarr-python's ``StoreTests`` do for stores.

The two contracts differ where a cache gives rows up (``tiers/base.py``): a cache's ``upsert``
and ``flush`` return the rows it displaced or found dirty, and it has ``evict``; the
persistent store displaces nothing, keeps no dirty flags and has no ``evict``. The shared
tests write through :func:`write` and :func:`flush`, which read the persistent store's
"nothing" as an empty :class:`Evicted`.
"""

from __future__ import annotations

from collections.abc import Callable

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from daskhps.errors import CapacityError, DataError
from daskhps.tiers.base import Cache, Evicted, PersistentStore, Tier

MakeTier = Callable[[int, int], Tier]
MakeCache = Callable[[int, int], Cache]

# Devices a torch-backed tier runs on; CUDA cases carry the `gpu` marker.
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]

WIDTH = 5
EXTREME_KEYS = [-(2**63), 2**63 - 1, -1, 0, 1]


def keys_of(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def rows_for(keys: torch.Tensor, width: int = WIDTH, salt: float = 0.0) -> torch.Tensor:
    """Distinct rows derived from keys, so a row in the wrong place is visible."""
    k = keys.to(torch.float64).remainder(1_000_003).to(torch.float32)
    cols = torch.arange(width, dtype=torch.float32)
    return k[:, None] * 0.5 + cols[None, :] + salt


def odd_bits_rows(n: int, width: int = WIDTH) -> torch.Tensor:
    """Rows whose bit patterns a float-normalising copy would change: NaN payloads,
    denormals, negative zero, integers stored as float32 bit patterns (Adam step counts)."""
    bits = torch.tensor(
        [0x7FC00001, 0x7FA12345, 0x00000001, 0x80000000, 0x00000007, 0xFFFFFFFF, 0x3F800000],
        dtype=torch.int64,
    )
    idx = torch.arange(n * width) % bits.numel()
    raw = bits[idx].to(torch.int32).view(torch.float32)  # int64 -> int32 wraps to the same bits
    return raw.reshape(n, width).clone()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32)))


def write(tier: Tier, keys: torch.Tensor, rows: torch.Tensor, *, dirty: bool = True) -> Evicted:
    """Upsert through either contract: the rows a cache displaced; none for the store."""
    if isinstance(tier, Cache):
        return tier.upsert(keys, rows, dirty=dirty)
    assert isinstance(tier, PersistentStore)
    tier.upsert(keys, rows)
    return Evicted.empty(tier.width, tier.device)


def flush(tier: Tier) -> Evicted:
    """Flush through either contract: a cache's dirty rows; none for the store."""
    if isinstance(tier, Cache):
        return tier.flush()
    assert isinstance(tier, PersistentStore)
    tier.flush()
    return Evicted.empty(tier.width, tier.device)


def resident_model(tier: Tier) -> dict[int, np.ndarray]:
    keys = tier.keys().cpu()
    got = tier.lookup(keys.to(tier.device))
    assert bool(got.found.all())
    rows = got.rows.cpu().view(torch.int32).numpy()
    return {int(k): rows[i].copy() for i, k in enumerate(keys.tolist())}


class TierConformance:
    """Behaviour every tier shares. Subclasses provide the ``make_tier`` fixture."""

    @pytest.fixture
    def make_tier(self) -> MakeTier:  # pragma: no cover - overridden
        raise NotImplementedError

    # -- basic map behaviour ---------------------------------------------------------

    def test_empty_lookup_misses(self, make_tier: MakeTier) -> None:
        tier = make_tier(WIDTH, 16)
        got = tier.lookup(keys_of(3, 4, 5).to(tier.device))
        assert got.rows.shape == (3, WIDTH)
        assert got.rows.dtype == torch.float32
        assert not bool(got.found.any())
        assert bool((got.rows == 0).all())
        assert len(tier) == 0

    def test_upsert_then_lookup_is_verbatim(self, make_tier: MakeTier) -> None:
        tier = make_tier(WIDTH, 16)
        keys = keys_of(*EXTREME_KEYS, 42, 7)
        rows = odd_bits_rows(len(keys))
        ev = write(tier, keys.to(tier.device), rows.to(tier.device))
        assert len(ev) == 0
        probe = keys_of(7, 999, *EXTREME_KEYS).to(tier.device)
        got = tier.lookup(probe)
        assert got.found.cpu().tolist() == [True, False] + [True] * len(EXTREME_KEYS)
        assert same_bits(got.rows[0].cpu(), rows[-1])
        assert same_bits(got.rows[2:].cpu(), rows[: len(EXTREME_KEYS)])
        assert len(tier) == len(keys)
        assert sorted(tier.keys().cpu().tolist()) == sorted(keys.tolist())

    def test_overwrite_replaces_row(self, make_tier: MakeTier) -> None:
        tier = make_tier(WIDTH, 16)
        keys = keys_of(1, 2, 3).to(tier.device)
        write(tier, keys, rows_for(keys.cpu()).to(tier.device))
        new = rows_for(keys.cpu()[1:], salt=100.0).to(tier.device)
        write(tier, keys[1:], new)
        got = tier.lookup(keys)
        assert bool(got.found.all())
        assert torch.equal(got.rows[0].cpu(), rows_for(keys.cpu()[:1])[0])
        assert torch.equal(got.rows[1:].cpu(), new.cpu())
        assert len(tier) == 3

    def test_lookup_into_preallocated_out(self, make_tier: MakeTier) -> None:
        tier = make_tier(WIDTH, 16)
        keys = keys_of(10, 11).to(tier.device)
        rows = rows_for(keys.cpu()).to(tier.device)
        write(tier, keys, rows)
        out = torch.full((3, WIDTH), -7.0, device=tier.device)
        got = tier.lookup(keys_of(11, 12, 10).to(tier.device), out=out)
        assert got.rows.data_ptr() == out.data_ptr()
        assert torch.equal(out[0].cpu(), rows[1].cpu())
        assert bool((out[1] == 0).all())
        assert torch.equal(out[2].cpu(), rows[0].cpu())

    def test_empty_inputs(self, make_tier: MakeTier) -> None:
        tier = make_tier(WIDTH, 16)
        none = torch.empty(0, dtype=torch.int64, device=tier.device)
        assert tier.lookup(none).rows.shape == (0, WIDTH)
        assert len(write(tier, none, torch.empty(0, WIDTH, device=tier.device))) == 0
        if isinstance(tier, Cache):
            assert len(tier.evict(keys=none)) == 0
        assert len(tier) == 0

    # -- bad input: clear errors, tier unchanged ---------------------------------------

    @pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.uint8])
    def test_wrong_key_dtype_names_the_tier(self, make_tier: MakeTier, dtype: torch.dtype) -> None:
        tier = make_tier(WIDTH, 16)
        keys = keys_of(1, 2).to(tier.device)
        write(tier, keys, rows_for(keys.cpu()).to(tier.device))
        before = resident_model(tier)
        bad = torch.tensor([5, 6], dtype=dtype, device=tier.device)
        with pytest.raises(DataError, match="int64") as info:
            write(tier, bad, rows_for(keys.cpu()).to(tier.device))
        assert tier.name in str(info.value)
        with pytest.raises(DataError, match="int64"):
            tier.lookup(bad)
        assert _equal_models(resident_model(tier), before)

    def test_keys_must_be_1d(self, make_tier: MakeTier) -> None:
        tier = make_tier(WIDTH, 16)
        with pytest.raises(DataError, match="1-D"):
            tier.lookup(torch.zeros(2, 2, dtype=torch.int64, device=tier.device))

    @pytest.mark.parametrize(
        "shape,dtype",
        [((2, WIDTH + 1), torch.float32), ((3, WIDTH), torch.float32), ((2, WIDTH), torch.float64)],
    )
    def test_wrong_rows_rejected_and_tier_unchanged(
        self, make_tier: MakeTier, shape: tuple[int, int], dtype: torch.dtype
    ) -> None:
        tier = make_tier(WIDTH, 16)
        keys = keys_of(1, 2).to(tier.device)
        write(tier, keys, rows_for(keys.cpu()).to(tier.device))
        before = resident_model(tier)
        with pytest.raises(DataError) as info:
            bad_rows = torch.zeros(shape, dtype=dtype).to(tier.device)
            write(tier, keys_of(1, 9).to(tier.device), bad_rows)
        assert tier.name in str(info.value)
        assert _equal_models(resident_model(tier), before)

    def test_duplicate_keys_in_upsert_rejected(self, make_tier: MakeTier) -> None:
        tier = make_tier(WIDTH, 16)
        keys = keys_of(4, 5, 4).to(tier.device)
        with pytest.raises(DataError, match="duplicate") as info:
            write(tier, keys, rows_for(keys.cpu()).to(tier.device))
        assert tier.name in str(info.value)
        assert len(tier) == 0

    # -- capacity and dirty tracking -----------------------------------------------

    def test_nothing_is_lost_when_over_capacity(self, make_tier: MakeTier) -> None:
        cap = 8
        tier = make_tier(WIDTH, cap)
        latest: dict[int, torch.Tensor] = {}
        displaced: dict[int, torch.Tensor] = {}
        for step in range(6):
            keys = torch.arange(step * 3, step * 3 + 5, dtype=torch.int64)
            rows = rows_for(keys, salt=float(step))
            ev = write(tier, keys.to(tier.device), rows.to(tier.device))
            just_written = set(ev.keys.cpu().tolist()) & set(keys.tolist())
            assert not just_written, "displaced a key just written"
            for k, r in zip(ev.keys.cpu().tolist(), ev.rows.cpu(), strict=True):
                displaced[k] = r
            for k, r in zip(keys.tolist(), rows, strict=True):
                latest[k] = r
                displaced.pop(k, None)
            if tier.capacity_rows is not None:
                assert len(tier) <= tier.capacity_rows
        resident = resident_model(tier)
        assert set(resident) | set(displaced) == set(latest)
        assert not set(resident) & set(displaced)
        for k, r in latest.items():
            got = resident[k] if k in resident else displaced[k].view(torch.int32).numpy()
            assert np.array_equal(got, r.view(torch.int32).numpy()), k

    def test_upsert_beyond_capacity_in_one_call(self, make_tier: MakeTier) -> None:
        tier = make_tier(WIDTH, 4)
        keys = torch.arange(100, 110, dtype=torch.int64)
        if tier.capacity_rows is None or tier.capacity_rows >= len(keys):
            write(tier, keys.to(tier.device), rows_for(keys).to(tier.device))
            assert len(tier) == len(keys)
            return
        write(tier, keys[:2].to(tier.device), rows_for(keys[:2]).to(tier.device))
        before = resident_model(tier)
        with pytest.raises(CapacityError) as info:
            write(tier, keys.to(tier.device), rows_for(keys).to(tier.device))
        assert tier.name in str(info.value)
        assert _equal_models(resident_model(tier), before)

    def test_flush_returns_each_dirty_row_once(self, make_tier: MakeTier) -> None:
        tier = make_tier(WIDTH, 16)
        dirty = keys_of(1, 2).to(tier.device)
        clean = keys_of(3).to(tier.device)
        write(tier, dirty, rows_for(dirty.cpu()).to(tier.device), dirty=True)
        write(tier, clean, rows_for(clean.cpu()).to(tier.device), dirty=False)
        first = flush(tier)
        second = flush(tier)
        assert len(second) == 0
        if tier.persistent:
            assert len(first) == 0
        else:
            assert sorted(first.keys.cpu().tolist()) == [1, 2]
            assert bool(first.dirty.all())
            order = first.keys.cpu().argsort()
            assert torch.equal(first.rows.cpu()[order], rows_for(dirty.cpu()))
        assert len(tier) == 3  # flushing keeps rows resident

    # -- against a dict model --------------------------------------------------------

    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        ops=st.lists(
            st.tuples(
                st.sampled_from(["upsert", "evict", "flush", "lookup"]),
                st.lists(st.integers(-6, 20), max_size=7, unique=True),
                st.booleans(),
            ),
            max_size=25,
        )
    )
    def test_matches_dict_model(self, make_tier: MakeTier, ops: list) -> None:
        cap = 6
        tier = make_tier(WIDTH, cap)
        dev = tier.device
        model: dict[int, tuple[torch.Tensor, bool]] = {}  # key -> (latest row, dirty)
        below: dict[int, torch.Tensor] = {}  # rows pushed out dirty, as the tier below sees them
        for i, (op, ks, flag) in enumerate(ops):
            keys = torch.tensor(ks, dtype=torch.int64)
            if op == "upsert":
                if tier.capacity_rows is not None and len(ks) > tier.capacity_rows:
                    continue
                rows = rows_for(keys, salt=float(i))
                ev = write(tier, keys.to(dev), rows.to(dev), dirty=flag)
                for k, r in zip(keys.tolist(), rows, strict=True):
                    model[k] = (r, flag)
                _absorb(ev, model, below)
            elif op == "evict":
                if isinstance(tier, Cache):  # the persistent store gives no row up
                    _absorb(tier.evict(keys=keys.to(dev)), model, below)
            elif op == "flush":
                ev = flush(tier)
                for k, r in zip(ev.keys.cpu().tolist(), ev.rows.cpu(), strict=True):
                    assert model[k][1], f"flush returned clean key {k}"
                    assert torch.equal(r, model[k][0])
                    below[k] = r
                    model[k] = (r, False)
                if not tier.persistent:
                    assert not any(d for _, d in model.values())
            else:
                got = tier.lookup(keys.to(dev))
                for j, k in enumerate(keys.tolist()):
                    assert bool(got.found[j]) == (k in model), k
                    if k in model:
                        assert torch.equal(got.rows[j].cpu(), model[k][0])
            if tier.capacity_rows is not None:
                assert len(tier) <= tier.capacity_rows
            assert set(tier.keys().cpu().tolist()) == set(model)


class CacheConformance(TierConformance):
    """What every cache does on top: give rows up, by key or by its replacement policy, with
    their dirty flags. Subclasses provide ``make_tier`` returning a :class:`Cache`."""

    def test_evict_by_keys(self, make_tier: MakeCache) -> None:
        tier = make_tier(WIDTH, 16)
        keys = keys_of(1, 2, 3).to(tier.device)
        rows = rows_for(keys.cpu()).to(tier.device)
        tier.upsert(keys, rows)
        ev = tier.evict(keys=keys_of(3, 77, 1).to(tier.device))
        got = dict(zip(ev.keys.cpu().tolist(), ev.rows.cpu(), strict=True))
        assert set(got) == {1, 3}
        assert torch.equal(got[1], rows[0].cpu())
        assert torch.equal(got[3], rows[2].cpu())
        assert bool(ev.dirty.all())
        assert sorted(tier.keys().cpu().tolist()) == [2]
        assert not bool(tier.lookup(keys_of(1, 3).to(tier.device)).found.any())

    @settings(
        max_examples=30,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        dirty=st.sets(st.integers(0, 40), max_size=14),
        limit=st.integers(0, 7),
    )
    def test_a_flush_in_steps_returns_each_dirty_row_once(
        self, make_tier: MakeCache, dirty: set[int], limit: int
    ) -> None:
        """Steps of at most ``limit`` rows return the dirty rows once each, the rest stay
        dirty for the next step, and nothing is left once a step returns none."""
        tier = make_tier(WIDTH, 16)
        keys = keys_of(*sorted(dirty)).to(tier.device)
        tier.upsert(keys, rows_for(keys.cpu()).to(tier.device), dirty=True)
        clean = keys_of(100, 101).to(tier.device)
        tier.upsert(clean, rows_for(clean.cpu()).to(tier.device), dirty=False)
        seen: list[int] = []
        for _ in range(len(dirty) + 1):
            step = tier.flush(limit=limit)
            assert len(step) <= limit
            seen += step.keys.cpu().tolist()
            if limit == 0 or not len(step):
                break
            order = step.keys.cpu().argsort()
            assert same_bits(step.rows.cpu()[order], rows_for(step.keys.cpu()[order]))
        if limit == 0:
            assert seen == [] and sorted(tier.flush().keys.cpu().tolist()) == sorted(dirty)
        else:
            assert sorted(seen) == sorted(dirty)  # once each, the clean rows never
        assert len(tier.flush()) == 0 and len(tier) == len(dirty) + 2

    def test_evict_n_by_policy(self, make_tier: MakeCache) -> None:
        tier = make_tier(WIDTH, 16)
        keys = torch.arange(6, dtype=torch.int64)
        tier.upsert(keys.to(tier.device), rows_for(keys).to(tier.device))
        ev = tier.evict(n=4)
        assert len(ev) == 4
        assert len(tier) == 2
        left = set(tier.keys().cpu().tolist())
        assert left | set(ev.keys.cpu().tolist()) == set(range(6))
        assert torch.equal(ev.rows.cpu(), rows_for(ev.keys.cpu()))

    def test_clean_rows_evict_clean(self, make_tier: MakeCache) -> None:
        tier = make_tier(WIDTH, 16)
        k = keys_of(8, 9).to(tier.device)
        tier.upsert(k, rows_for(k.cpu()).to(tier.device), dirty=False)
        ev = tier.evict(keys=k)
        assert not bool(ev.dirty.any())


def _absorb(ev: Evicted, model: dict, below: dict) -> None:
    """Move displaced rows out of the resident model, checking they are the latest."""
    for k, r, d in zip(ev.keys.cpu().tolist(), ev.rows.cpu(), ev.dirty.cpu().tolist(), strict=True):
        assert k in model, f"evicted key {k} that was not resident"
        row, dirty = model.pop(k)
        assert torch.equal(r, row), f"evicted row of key {k} is not its latest value"
        assert d == dirty, f"dirty flag of key {k}: got {d}, expected {dirty}"
        if d:
            below[k] = r


def _equal_models(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

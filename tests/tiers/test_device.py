"""DeviceCache: replacement order, pinning, dirty tracking, exact capacity, errors, a dict model.

The cache behaviour lives in the slot-cache core that HostMemory shares; ``test_host.py`` runs
the state machine here against a HostMemory too.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from daskhps.errors import CapacityError, ConfigError, DataError
from daskhps.tiers._slots import SlotCache
from daskhps.tiers.base import Evicted
from daskhps.tiers.device import DeviceCache
from tests.tiers.conformance import DEVICES, CacheConformance, MakeCache, odd_bits_rows, same_bits

W = 4


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def k(*xs: int, device: str | torch.device = "cpu") -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64, device=device)


def rows(keys: torch.Tensor, salt: float = 0.0) -> torch.Tensor:
    base = keys.to(torch.float32)[:, None] + torch.arange(W, device=keys.device)
    return base + salt


def cache(device: str, cap: int = 4, policy: str = "lru") -> DeviceCache:
    return DeviceCache("ads/device", W, cap, device=device, policy=policy)


class TestConformance(CacheConformance):
    @pytest.fixture(params=DEVICES)
    def make_tier(self, request: pytest.FixtureRequest) -> MakeCache:
        return lambda width, cap: DeviceCache("ads/device", width, cap, device=request.param)


class TestConformanceLFU(CacheConformance):
    @pytest.fixture
    def make_tier(self) -> MakeCache:
        return lambda width, cap: DeviceCache("ads/device", width, cap, policy="lfu")


def test_lru_evicts_least_recently_used(device: str) -> None:
    c = cache(device)
    for x in (1, 2, 3, 4):  # one call each: distinct stamps
        c.upsert(k(x, device=device), rows(k(x, device=device)))
    c.lookup(k(1, 3, device=device))  # 2 then 4 are now the oldest
    ev = c.upsert(k(5, device=device), rows(k(5, device=device)))
    assert ev.keys.tolist() == [2]
    assert c.evict(n=1).keys.tolist() == [4]
    c.lookup(k(1, device=device))
    assert sorted(c.evict(n=2).keys.tolist()) == [3, 5]
    assert c.keys().tolist() == [1]


def test_lfu_evicts_least_frequently_used_then_oldest(device: str) -> None:
    c = cache(device, policy="lfu")
    c.upsert(k(1, 2, 3, 4, device=device), rows(k(1, 2, 3, 4, device=device)))
    for _ in range(3):
        c.lookup(k(1, 2, device=device))
    c.lookup(k(4, 3, device=device))
    c.lookup(k(4, device=device))
    # uses: 1 -> 4, 2 -> 4, 3 -> 2, 4 -> 3
    assert c.evict(n=1).keys.tolist() == [3]
    assert c.evict(n=1).keys.tolist() == [4]
    c.upsert(k(9, device=device), rows(k(9, device=device)))  # one use: the next victim
    assert c.evict(n=1).keys.tolist() == [9]


def test_capacity_is_exact(device: str) -> None:
    c = cache(device, cap=37)
    keys = torch.arange(37, device=device) * 1_000_003  # all fit: no associativity losses
    assert len(c.upsert(keys, rows(keys))) == 0
    assert len(c) == c.capacity_rows == 37
    ev = c.upsert(k(-5, device=device), rows(k(-5, device=device)))
    assert len(ev) == 1 and len(c) == 37
    assert c.stats.extra["index_load"] <= 0.5 and c.stats.extra["index_bytes"] > 0


def test_pinned_rows_are_never_displaced(device: str) -> None:
    c = cache(device)
    c.upsert(k(1, 2, 3, 4, device=device), rows(k(1, 2, 3, 4, device=device)))
    assert c.pin(k(1, 2, 3, 77, device=device)).tolist() == [True, True, True, False]
    assert c.pinned_count == 3
    ev = c.upsert(k(5, device=device), rows(k(5, device=device)))
    assert ev.keys.tolist() == [4]
    with pytest.raises(CapacityError, match=r"ads/device.*pinned"):
        c.upsert(k(6, 7, device=device), rows(k(6, 7, device=device)))  # only 5 can go
    c.pin(k(5, device=device))
    before = sorted(c.keys().tolist())
    with pytest.raises(CapacityError, match="unpin"):
        c.upsert(k(6, device=device), rows(k(6, device=device)))
    assert sorted(c.keys().tolist()) == before
    assert len(c.evict(n=3)) == 0
    with pytest.raises(DataError, match="unpin_all"):
        c.evict(keys=k(1, device=device))
    c.unpin_all()
    assert c.pinned_count == 0 and len(c.evict(n=3)) == 3


def test_capacity_error_leaves_tier_unchanged(device: str) -> None:
    c = cache(device)
    c.upsert(k(1, 2, device=device), rows(k(1, 2, device=device)))
    before = c.lookup(k(1, 2, device=device)).rows.clone()
    keys = torch.arange(10, 15, device=device)
    with pytest.raises(CapacityError, match=r"ads/device.*capacity of 4"):
        c.upsert(keys, rows(keys))
    assert sorted(c.keys().tolist()) == [1, 2]
    assert torch.equal(c.lookup(k(1, 2, device=device)).rows, before)


def test_upsert_never_displaces_its_own_keys(device: str) -> None:
    c = cache(device)
    c.upsert(k(1, 2, 3, 4, device=device), rows(k(1, 2, 3, 4, device=device)))
    c.lookup(k(4, device=device))
    # 1, 2, 3 are the oldest; overwriting them while adding 5 must displace 4
    ev = c.upsert(k(1, 2, 3, 5, device=device), rows(k(1, 2, 3, 5, device=device), 1.0))
    assert ev.keys.tolist() == [4]


def test_eviction_returns_rows_bit_for_bit(device: str) -> None:
    c = DeviceCache("ads/device", 5, 8, device=device)
    keys = torch.arange(8, device=device) - 4
    odd = odd_bits_rows(8).to(device)
    c.upsert(keys, odd)
    ev = c.evict(keys=keys)
    order = torch.argsort(ev.keys)
    assert torch.equal(ev.keys[order], keys)
    assert same_bits(ev.rows[order].cpu(), odd.cpu())


def test_dirty_tracking_and_flush(device: str) -> None:
    c = cache(device, cap=8)
    c.upsert(k(1, 2, device=device), rows(k(1, 2, device=device)), dirty=False)
    c.upsert(k(3, device=device), rows(k(3, device=device)))
    slots = c.find_slots(k(2, 9, device=device))
    assert slots[1] == -1
    c.rows[slots[:1]] += 10.0  # an in-place training update
    c.mark_dirty(slots[:1])
    f = c.flush()
    assert sorted(f.keys.tolist()) == [2, 3]
    by_key = dict(zip(f.keys.tolist(), f.rows, strict=True))
    assert torch.equal(by_key[2], rows(k(2, device=device))[0] + 10.0)
    assert len(c.flush()) == 0
    c.upsert(k(1, device=device), rows(k(1, device=device), 5.0), dirty=True)
    ev = c.evict(keys=k(1, 2, device=device))
    assert dict(zip(ev.keys.tolist(), ev.dirty.tolist(), strict=True)) == {1: True, 2: False}
    with pytest.raises(DataError, match="hold no row"):
        c.mark_dirty(slots)  # -1 and a slot freed by the eviction


def test_find_slots_touch_counts_as_use(device: str) -> None:
    c = cache(device)
    for x in (1, 2, 3, 4):
        c.upsert(k(x, device=device), rows(k(x, device=device)))
    c.find_slots(k(1, device=device))  # no touch: 1 stays the oldest
    assert c.evict(n=1).keys.tolist() == [1]
    c.find_slots(k(2, device=device), touch=True)
    assert c.evict(n=1).keys.tolist() == [3]


def test_stats_count_hits_misses_evictions(device: str) -> None:
    c = cache(device, cap=2)
    c.upsert(k(1, 2, device=device), rows(k(1, 2, device=device)))
    c.lookup(k(1, 5, 6, device=device))
    c.upsert(k(7, device=device), rows(k(7, device=device)))
    s = c.stats
    assert (s.lookups, s.hits, s.evictions, s.inserts) == (3, 1, 1, 3)
    assert s.as_dict()["hit_rate"] == pytest.approx(1 / 3)


def test_bad_input_is_rejected_before_any_change() -> None:
    c = cache("cpu")
    c.upsert(k(1, 2), rows(k(1, 2)))
    with pytest.raises(DataError, match=r"ads/device.*duplicate key 3"):
        c.upsert(k(3, 4, 3), rows(k(3, 4, 3)))
    with pytest.raises(DataError, match=r"ads/device.*shape"):
        c.upsert(k(3), torch.zeros(1, W + 1))
    with pytest.raises(DataError, match=r"ads/device.*out="):
        c.lookup(k(1), out=torch.zeros(2, W))
    with pytest.raises(DataError, match="exactly one"):
        c.evict()
    with pytest.raises(DataError, match="int64"):
        c.pin(k(1).to(torch.int32))
    assert sorted(c.keys().tolist()) == [1, 2] and c.stats.inserts == 2


@pytest.mark.parametrize(
    "kwargs,match",
    [({"width": 0}, "width"), ({"capacity_rows": 0}, "capacity"), ({"policy": "fifo"}, "policy")],
)
def test_bad_configuration(kwargs: dict, match: str) -> None:
    args: dict = {"name": "ads/device", "width": W, "capacity_rows": 4} | kwargs
    with pytest.raises(ConfigError, match=match):
        DeviceCache(**args)


def test_keys_moved_to_the_cache_device() -> None:
    c = cache("cpu")
    c.upsert(k(1), rows(k(1)))
    assert 1 in c and 2 not in c


# -- a state machine against a dict model ---------------------------------------------------


class CacheMachine(RuleBasedStateMachine):
    """Random upserts, lookups, evictions, flushes, pins against ``{key: (row, dirty)}``."""

    CAP = 6
    make: Callable[[int], SlotCache] = staticmethod(lambda cap: DeviceCache("m/device", W, cap))

    def __init__(self) -> None:
        super().__init__()
        self.c = self.make(self.CAP)
        self.cap = self.c.capacity_rows
        self.model: dict[int, tuple[torch.Tensor, bool]] = {}
        self.pinned: set[int] = set()
        self.step = 0.0

    def absorb(self, ev: Evicted, forbidden: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        for key, row, dirty in zip(ev.keys.tolist(), ev.rows, ev.dirty.tolist(), strict=True):
            assert key not in forbidden and key not in self.pinned, key
            want, want_dirty = self.model.pop(key)
            assert same_bits(row, want) and dirty == want_dirty, key

    @rule(keys=st.lists(st.integers(-10, 30), unique=True, max_size=9), dirty=st.booleans())
    def upsert(self, keys: list[int], dirty: bool) -> None:
        self.step += 1
        kt = torch.tensor(keys, dtype=torch.int64)
        r = rows(kt, self.step)
        new = [x for x in keys if x not in self.model]
        evictable = len([x for x in self.model if x not in self.pinned and x not in keys])
        fits = len(new) <= self.cap - len(self.model) + evictable
        if not fits:
            with pytest.raises(CapacityError):
                self.c.upsert(kt, r, dirty=dirty)
            return
        ev = self.c.upsert(kt, r, dirty=dirty)
        assert len(ev) == max(0, len(self.model) + len(new) - self.cap)  # only when full
        self.absorb(ev, set(keys))
        for x, row in zip(keys, r, strict=True):
            self.model[x] = (row, dirty)

    @rule(keys=st.lists(st.integers(-10, 30), max_size=9))
    def lookup(self, keys: list[int]) -> None:
        got = self.c.lookup(torch.tensor(keys, dtype=torch.int64))
        for i, x in enumerate(keys):
            assert bool(got.found[i]) == (x in self.model)
            want = self.model[x][0] if x in self.model else torch.zeros(W)
            assert same_bits(got.rows[i], want)

    @rule(n=st.integers(0, 8))
    def evict_n(self, n: int) -> None:
        ev = self.c.evict(n=n)
        assert len(ev) == min(n, len(set(self.model) - self.pinned))
        self.absorb(ev)

    @rule(keys=st.lists(st.integers(-10, 30), unique=True, max_size=5))
    def evict_keys(self, keys: list[int]) -> None:
        if set(keys) & self.pinned:
            with pytest.raises(DataError):
                self.c.evict(keys=torch.tensor(keys, dtype=torch.int64))
            return
        ev = self.c.evict(keys=torch.tensor(keys, dtype=torch.int64))
        assert sorted(ev.keys.tolist()) == sorted(x for x in keys if x in self.model)
        self.absorb(ev)

    @rule()
    def flush(self) -> None:
        f = self.c.flush()
        assert sorted(f.keys.tolist()) == sorted(x for x, (_, d) in self.model.items() if d)
        for x, row in zip(f.keys.tolist(), f.rows, strict=True):
            assert same_bits(row, self.model[x][0])
            self.model[x] = (self.model[x][0], False)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        keys = data.draw(st.lists(st.sampled_from(sorted(self.model)), unique=True, max_size=3))
        self.c.pin(torch.tensor(keys, dtype=torch.int64))
        self.pinned |= set(keys)

    @rule()
    def unpin_all(self) -> None:
        self.c.unpin_all()
        self.pinned.clear()

    @invariant()
    def same_keys(self) -> None:
        assert len(self.c) == len(self.model) <= self.cap
        assert sorted(self.c.keys().tolist()) == sorted(self.model)
        assert self.c.pinned_count == len(self.pinned)


CacheMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestCacheMachine = CacheMachine.TestCase


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_large_cache_on_cuda() -> None:
    c = DeviceCache("ads/device", 16, 100_000, device="cuda")
    keys = torch.randint(-(2**63), 2**63 - 1, (150_000,), device="cuda").unique()
    ev = c.upsert(keys[:100_000], rows(keys[:100_000]))
    assert len(ev) == 0
    ev = c.upsert(keys[100_000:], rows(keys[100_000:]))
    assert len(ev) == keys.numel() - 100_000 and len(c) == 100_000
    got = c.lookup(keys)
    assert int(got.found.sum()) == 100_000


def test_lru_order_after_many_calls() -> None:
    c = cache("cpu", cap=3)  # past 4 * capacity calls LRU ranks with top-k, not a histogram
    for x in (1, 2, 3):
        c.upsert(k(x), rows(k(x)))
    for _ in range(20):
        c.lookup(k(3))
    c.lookup(k(1))
    assert c.evict(n=1).keys.tolist() == [2]
    assert c.evict(n=1).keys.tolist() == [3]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lru_is_exact_with_the_victim_pool(seed: int) -> None:
    """The displaced row is always one of the least recently used (ties share a call)."""
    import random

    rng = random.Random(seed)
    cap = 96  # large enough that evictions come from the pool
    c = cache("cpu", cap=cap)
    used: dict[int, int] = {}  # key -> call of its last use
    pinned: set[int] = set()
    fresh = iter(range(10_000))
    for call in range(600):
        op = rng.random()
        if op < 0.45 or not used:
            key = next(fresh)
            old = [rng.choice(list(used))] if used and rng.random() < 0.3 else []
            ev = c.upsert(k(*old, key), rows(k(*old, key)))  # overwriting old must keep it
            if len(used) == cap:
                can = {x: t for x, t in used.items() if x not in pinned and x not in old}
                (gone,) = ev.keys.tolist()
                assert can[gone] == min(can.values())
                del used[gone]
            used.update(dict.fromkeys((*old, key), call))
        elif op < 0.8:
            key = rng.choice(list(used))
            c.lookup(k(key))
            used[key] = call
        elif op < 0.87:
            key = rng.choice(list(used))
            if key not in pinned:
                c.evict(keys=k(key))
                del used[key]
        elif op < 0.95:
            key = rng.choice(list(used))
            c.pin(k(key))
            pinned.add(key)
        else:
            c.unpin_all()
            pinned.clear()
    assert sorted(c.keys().tolist()) == sorted(used)

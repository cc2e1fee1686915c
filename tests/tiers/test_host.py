"""HostMemory: capacity derived from a byte budget, pinned memory, and the shared cache behaviour.

Replacement order, pinning and dirty tracking are tested on DeviceCache, which shares the
slot-cache core; the conformance suite and the dict-model state machine run here as well.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings

from daskhps.errors import ConfigError
from daskhps.tiers._slots import bytes_per_row
from daskhps.tiers.host import HostMemory, rows_for_bytes
from daskhps.tiers.index import KeyIndex
from tests.tiers.conformance import CacheConformance, MakeCache, odd_bits_rows, same_bits
from tests.tiers.test_device import CacheMachine

MiB = 1 << 20


def budget_for(width: int, rows: int, policy: str = "lru") -> int:
    """Bytes a HostMemory needs for ``rows`` rows: slab, metadata and index."""
    sinks = 4 * width + 8 + (8 if policy == "lfu" else 0)  # the zero row, stamp/count sinks
    return sinks + rows * bytes_per_row(width, policy) + KeyIndex.nbytes_for(rows)


class TestConformance(CacheConformance):
    @pytest.fixture
    def make_tier(self) -> MakeCache:
        return lambda width, cap: HostMemory("ads/host", width, budget_for(width, cap))


@pytest.mark.parametrize("width", [1, 16, 64, 129])
@pytest.mark.parametrize("budget", [4096, MiB, 7 * MiB + 123])
def test_capacity_from_bytes_is_honest(width: int, budget: int) -> None:
    h = HostMemory("ads/host", width, budget)
    assert h.nbytes <= budget  # everything it allocated, index included, fits the budget
    assert h.capacity_rows == rows_for_bytes(width, budget)
    assert h.stats.extra["bytes"] == h.nbytes
    bigger = rows_for_bytes(width, budget + 1)
    assert bigger in (h.capacity_rows, h.capacity_rows + 1)  # the largest that fits
    assert h.capacity_rows * 4 * width <= budget


def test_budget_for_matches_allocation() -> None:
    for rows in (1, 7, 1000):
        h = HostMemory("ads/host", 8, budget_for(8, rows))
        assert h.capacity_rows == rows
        assert h.nbytes == budget_for(8, rows)


def test_fills_to_exact_capacity() -> None:
    h = HostMemory("ads/host", 8, 64 * 1024)
    cap = h.capacity_rows
    keys = torch.arange(cap) * 7 - 1000
    assert len(h.upsert(keys, torch.ones(cap, 8))) == 0 and len(h) == cap
    ev = h.upsert(torch.tensor([10**12]), torch.zeros(1, 8))
    assert len(ev) == 1 and len(h) == cap


def test_too_small_a_budget_says_what_to_do() -> None:
    with pytest.raises(ConfigError, match=r"ads/host.*hold no row.*larger share"):
        HostMemory("ads/host", 64, 100)


def test_rows_move_verbatim() -> None:
    h = HostMemory("ads/host", 5, MiB)
    keys = torch.tensor([-(2**63), -1, 0, 2**63 - 1, 3, 4, 5])
    odd = odd_bits_rows(7)
    h.upsert(keys, odd)
    assert same_bits(h.lookup(keys).rows, odd)
    ev = h.evict(keys=keys)
    order = torch.argsort(ev.keys)
    assert same_bits(ev.rows[order], odd[torch.argsort(keys)])


def test_lives_on_cpu_and_pins_only_with_cuda() -> None:
    h = HostMemory("ads/host", 4, MiB)
    assert h.device == torch.device("cpu")
    assert h.rows.is_pinned() == torch.cuda.is_available()
    assert not HostMemory("ads/host", 4, MiB, pin_memory=False).rows.is_pinned()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_slab_copies_to_device() -> None:
    h = HostMemory("ads/host", 4, MiB, pin_memory=True)
    keys = torch.arange(100)
    h.upsert(keys, torch.randn(100, 4))
    got = h.lookup(keys)
    assert torch.equal(got.rows.to("cuda", non_blocking=True).cpu(), got.rows)


class HostMachine(CacheMachine):
    make = staticmethod(
        lambda cap: HostMemory("m/host", 4, budget_for(4, cap, "lfu"), policy="lfu")
    )


HostMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
TestHostMachine = HostMachine.TestCase

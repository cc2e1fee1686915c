"""Bytes between ranks as the collectives count them (``Comm.traffic``), against an exact model
of the routing, over real gloo groups of 2 and 3 processes."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from daskhps.distributed.collective import Traffic, ring_allreduce_bytes
from tests.distributed import _ranks

KEY, ROW = 8, _ranks.SPEC.dim * 4  # int64 keys; float32 rows and gradients
DENSE = (5 * 3 + 3) * 4  # the Linear(5, 3) all-reduced


def _others(counts: list[int], rank: int) -> int:
    return sum(counts) - counts[rank]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3], ids=["2-ranks", "3-ranks"])
def test_counted_bytes_are_the_routings_and_never_a_ranks_own(tmp_path, world):
    mp.spawn(_ranks.run_traffic, args=(world, str(tmp_path)), nprocs=world, join=True)
    steps = [torch.load(tmp_path / f"traffic-{r}.pt") for r in range(world)]
    for rank, mine in enumerate(steps):
        for b, s in enumerate(mine):
            send, recv = s["send"], s["recv"]
            # every rank's sends to r are what r receives: the routing agrees across ranks
            assert recv == [steps[q][b]["send"][rank] for q in range(world)]
            asked, served = _others(send, rank), _others(recv, rank)
            counts = KEY * (world - 1)  # one int64 count to each other rank
            assert s["route"] == {"keys": (counts + KEY * asked, counts + KEY * served)}
            assert s["pull"] == {"rows": (ROW * served, ROW * asked)}
            assert s["push"] == {"grads": (ROW * asked, ROW * served)}
            ring = ring_allreduce_bytes(DENSE, world)
            assert s["dense"] == {"dense": (ring, ring)}
        # the empty batch moves only the counts; the batch of the rank's own keys, the
        # same: its keys, rows and gradients never leave the rank
        for s in mine[-2:]:
            assert _others(s["send"], rank) == 0
            assert s["route"]["keys"][0] == KEY * (world - 1)
            assert s["pull"]["rows"][1] == 0 and s["push"]["grads"][0] == 0
        assert mine[-1]["send"][rank] > 0  # the rank's own keys were routed, to itself


def test_traffic_adds_by_kind_and_take_starts_again() -> None:
    t = Traffic()
    t.add("rows", 10, 4)
    t.add("rows", 5, 0)
    t.add("keys", 0, 8)
    assert t.take() == {"rows": (15, 4), "keys": (0, 8)}
    assert t.take() == {}


def test_a_ring_all_reduce_moves_two_n_minus_one_nths_each_way() -> None:
    assert ring_allreduce_bytes(1000, 1) == 0
    assert ring_allreduce_bytes(1000, 2) == 1000
    assert ring_allreduce_bytes(1000, 4) == 1500


def test_one_rank_counts_nothing() -> None:
    from daskhps.distributed import Comm, Exchange
    from daskhps.sharding import ShardMap

    comm = Comm.create(0, 1)
    ex = Exchange(comm, ShardMap(4, 1))
    routing = ex.route(torch.tensor([3, 5, 3]))
    rows = ex.pull_rows(routing, lambda k: torch.zeros(len(k), 2))
    ex.push_grads(routing, torch.ones_like(rows), lambda k, g: None)
    assert comm.traffic.take() == {}

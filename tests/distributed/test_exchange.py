"""The exchange over real gloo groups of 2 and 3 processes against a single-process table."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from daskhps.distributed import CommError, Exchange
from daskhps.sharding import ShardMap
from daskhps.table import EmbeddingTable
from tests.distributed import _ranks


def _reference(tmp_path, world: int, disjoint: bool):
    """Replay every round in one process: all pulls of a round, then all gradients at once."""
    seen = [[] for _ in range(world)]
    ex = Exchange(None, ShardMap(_ranks.NUM_SHARDS, 1))
    with EmbeddingTable.open(_ranks.SPEC, tmp_path / "ref", device_rows=20_000) as ref:
        for batch in _ranks.rounds(world, disjoint):
            routings = [ex.route(k) for k in batch]
            for r, routing in enumerate(routings):
                rows = ex.pull_rows(routing, ref.lookup)
                seen[r].append(rows[routing.inverse])
            keys = torch.cat([rt.keys for rt in routings])
            grads = torch.cat([_ranks.grads_for(rt.keys, r) for r, rt in enumerate(routings)])
            ref.apply_gradients(keys, grads)
        every = torch.unique(torch.cat([k for b in _ranks.rounds(world, disjoint) for k in b]))
        final = ref.lookup(every, read_only=True)
        ref.commit("end")
    return seen, every, final


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "disjoint"), [(2, False), (3, True)], ids=["2-ranks-shared-keys", "3-ranks-disjoint"]
)
def test_exchange_matches_one_process(tmp_path, world, disjoint):
    mp.spawn(_ranks.run_exchange, args=(world, str(tmp_path), disjoint), nprocs=world, join=True)
    outs = [torch.load(tmp_path / f"out-{r}.pt") for r in range(world)]
    seen, every, final = _reference(tmp_path, world, disjoint)

    # Pulled rows are the single-process rows, bit for bit (the first round before any
    # update; later rounds too, since the owner sums duplicates in requester order, the
    # same order as the reference's concatenation).
    for r in range(world):
        for got, want in zip(outs[r]["seen"], seen[r], strict=True):
            assert torch.equal(got, want)
    assert outs[world - 1]["seen"][-1].shape == (0, _ranks.SPEC.dim)  # sent nothing

    # Every key ends on exactly one owner with the reference's value.
    keys = torch.cat([o["keys"] for o in outs])
    rows = torch.cat([o["final"] for o in outs])
    order = torch.argsort(keys)
    assert torch.equal(keys[order], every)
    if disjoint:
        assert torch.equal(rows[order], final)
    else:
        torch.testing.assert_close(rows[order], final, rtol=0, atol=1e-6)

    # Dense gradients are summed across ranks.
    total = sum(range(1, world + 1))
    for o in outs:
        for i, g in enumerate(o["dense"]):
            assert torch.all(g == total * (i + 1))


def test_single_rank_needs_no_group(tmp_path):
    ex = Exchange(None, ShardMap(4, 1))
    keys = torch.tensor([[5, 3], [5, 9]])
    routing = ex.route(keys)
    assert routing.keys.tolist() == [3, 5, 9]
    assert routing.inverse.tolist() == [[1, 0], [1, 2]]
    with EmbeddingTable.open(_ranks.SPEC, tmp_path / "t", device_rows=16) as table:
        rows = ex.pull_rows(routing, table.lookup)
        want = table.lookup(keys.reshape(-1), read_only=True).reshape(2, 2, -1)
        assert torch.equal(rows[routing.inverse], want)
        before = rows.clone()
        ex.push_grads(routing, torch.ones(3, _ranks.SPEC.dim), table.apply_gradients)
        after = table.lookup(routing.keys, read_only=True)
        torch.testing.assert_close(after, before - 0.5)


def test_shard_map_must_match_ranks():
    with pytest.raises(CommError, match="num_workers equal to the number of ranks"):
        Exchange(None, ShardMap(4, 2))


def test_push_grads_checks_row_count(tmp_path):
    ex = Exchange(None, ShardMap(4, 1))
    routing = ex.route(torch.tensor([1, 2]))
    with pytest.raises(CommError, match="2 routed keys"):
        ex.push_grads(routing, torch.zeros(3, 8), lambda k, g: None)

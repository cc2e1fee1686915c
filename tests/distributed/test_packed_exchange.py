"""The packed exchange (rows of different widths) over real gloo groups of 1, 2 and 3 ranks
against a per-key reference: rows, gradient sums and the bytes counted."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
import torch.multiprocessing as mp

from daskhps.data.keyspace import TABLE_SHIFT
from daskhps.distributed import CommError, Exchange, KeyWidths
from daskhps.sharding import ShardMap
from tests.distributed import _packed_ranks as pr

FLOAT = 4  # float32 bytes


def _width(key: int) -> int:
    return pr.DIMS[key >> TABLE_SHIFT]


def _row(key: int) -> torch.Tensor:
    """The reference row of ``key``: the owner's row, zero beyond the key's width."""
    row = pr.lookup(torch.tensor([key]))[0]
    row[_width(key) :] = 0
    return row


def _grad(key: int, rank: int) -> torch.Tensor:
    row = pr.grads_for(torch.tensor([key]), rank)[0]
    row[_width(key) :] = 0
    return row


def _stack(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(rows) if rows else torch.zeros(0, pr.WIDEST)


def _run(tmp_path, world: int) -> list[dict]:
    if world == 1:
        pr.run_packed(0, 1, str(tmp_path))
    else:
        mp.spawn(pr.run_packed, args=(world, str(tmp_path)), nprocs=world, join=True)
    return [torch.load(tmp_path / f"packed-{r}.pt") for r in range(world)]


@pytest.mark.parametrize(
    "world",
    [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)],
    ids=["1-rank", "2-ranks", "3-ranks"],
)
def test_packed_exchange_matches_the_per_key_reference(tmp_path, world):
    outs = _run(tmp_path, world)
    owner = ShardMap(pr.NUM_SHARDS, world).worker
    for i, batch in enumerate(pr.rounds(world)):
        want: dict[int, torch.Tensor] = defaultdict(lambda: torch.zeros(pr.WIDEST))
        got: dict[int, torch.Tensor] = defaultdict(lambda: torch.zeros(pr.WIDEST))
        for r in range(world):
            s = outs[r]["steps"][i]
            # Pulled rows: the reference's, zero beyond each key's width, in batch order.
            assert torch.equal(s["seen"], _stack([_row(k) for k in batch[r].tolist()]))
            for k in torch.unique(batch[r]).tolist():
                want[k] += _grad(k, r)
            # The owner's gradients: one call, its own keys only, rows of the widest table.
            ((keys, grads),) = s["applied"]
            assert torch.equal(keys, s["owned"]) and grads.shape == (len(keys), pr.WIDEST)
            assert bool((owner(keys) == r).all())
            for k, g in zip(keys.tolist(), grads, strict=True):
                got[k] += g
            # Bytes: 4 per float of the keys that leave the rank, never of its own.
            if world == 1:
                assert s["pull"] == s["push"] == {}
                continue
            start = sum(s["recv"][:r])
            own = range(start, start + s["recv"][r])
            served = FLOAT * sum(
                _width(k) for j, k in enumerate(s["owned"].tolist()) if j not in own
            )
            off_rank = s["keys"][owner(s["keys"]) != r]
            asked = FLOAT * sum(_width(k) for k in off_rank.tolist())
            assert s["pull"] == {"rows": (served, asked)}
            assert s["push"] == {"grads": (asked, served)}
        # Every requester's gradient reached its owner: the sums match key for key, exactly.
        assert got.keys() == want.keys()
        for k in want:
            assert torch.equal(got[k], want[k]), k

    # The uneven round: the last rank asked for nothing, rank 1 served nothing.
    assert outs[world - 1]["steps"][-1]["seen"].shape == (0, pr.WIDEST)
    if world > 1:
        ((keys, grads),) = outs[1]["steps"][-1]["applied"]
        assert keys.numel() == 0 and grads.shape == (0, pr.WIDEST)

    # One table: widths change nothing, bit for bit and byte for byte.
    for o in outs:
        plain, packed = o["one"]
        assert torch.equal(plain["seen"], packed["seen"])
        ((_, want_g),), ((_, got_g),) = plain["applied"], packed["applied"]
        assert torch.equal(got_g, want_g)
        assert plain["traffic"] == packed["traffic"]


def test_rows_of_the_wrong_width_are_refused():
    ex = Exchange(None, ShardMap(4, 1), KeyWidths([4, 2]))
    routing = ex.route(torch.tensor([1, (1 << 56) | 2]))
    with pytest.raises(CommError, match=r"lookup_fn returned shape \(2, 2\) for 2 keys"):
        ex.pull_rows(routing, lambda k: torch.zeros(len(k), 2))
    with pytest.raises(CommError, match=r"rows are \[keys, 4\]"):
        ex.push_grads(routing, torch.zeros(2, 5), lambda k, g: None)

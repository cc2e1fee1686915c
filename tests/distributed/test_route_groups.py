"""Exchange.route's one-sort dedup and its position groups against torch.unique and a naive
grouping (the groups feed the fixed-order gradient sums of the batch gather)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.distributed.exchange import Exchange, _dedup, _regroup
from daskhps.sharding import ShardMap

batches = st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-5, 5), max_size=60).map(
    lambda xs: torch.tensor(xs, dtype=torch.int64)
)


def _naive_groups(inverse: torch.Tensor, n_unique: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of each unique index in turn (ascending), and the group boundaries."""
    groups = [(inverse == i).nonzero().squeeze(1) for i in range(n_unique)]
    sizes = torch.tensor([0] + [len(g) for g in groups], dtype=torch.int64)
    pos = torch.cat(groups) if groups else torch.empty(0, dtype=torch.int64)
    return pos, sizes.cumsum(0)


@settings(max_examples=150, deadline=None)
@given(batches)
def test_dedup_is_torch_unique_with_position_groups(keys: torch.Tensor) -> None:
    uniq, inverse, order, offsets, group = _dedup(keys)
    want_u, want_inv = torch.unique(keys, sorted=True, return_inverse=True)
    assert torch.equal(uniq, want_u) and torch.equal(inverse, want_inv)
    pos, bounds = _naive_groups(inverse, len(uniq))
    assert torch.equal(order, pos) and torch.equal(offsets, bounds)
    assert torch.equal(group, inverse[order])


@settings(max_examples=150, deadline=None)
@given(batches, st.integers(1, 4), st.integers(0, 2**32))
def test_regroup_follows_a_permutation_of_the_unique_keys(
    keys: torch.Tensor, world: int, seed: int
) -> None:
    uniq, inverse, order, offsets, group = _dedup(keys)
    # what route does for several ranks: unique keys grouped by owner, stable
    owner = torch.randint(0, world, (len(uniq),), generator=torch.Generator().manual_seed(seed))
    perm = torch.argsort(owner, stable=True)
    where = torch.empty_like(perm)
    where[perm] = torch.arange(len(perm))
    new_pos, new_offsets = _regroup(order, offsets, group, perm, where)
    pos, bounds = _naive_groups(where[inverse], len(uniq))
    assert torch.equal(new_pos, pos) and torch.equal(new_offsets, bounds)


def test_single_rank_route_carries_the_groups() -> None:
    keys = torch.tensor([[7, 3], [7, 9], [3, 3]])
    r = Exchange(None, ShardMap(4, 1)).route(keys)
    assert r.keys.tolist() == [3, 7, 9] and r.inverse.tolist() == [[1, 0], [1, 2], [0, 0]]
    assert r.order is not None and r.offsets is not None
    assert r.order.tolist() == [1, 4, 5, 0, 2, 3] and r.offsets.tolist() == [0, 3, 5, 6]

"""The batch gather's grouped backward (embedding_bag over route's position groups) against
``index_select``'s backward (``index_add_``): the same gradient bits, single- and multi-hot."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.distributed import Exchange
from daskhps.sharding import ShardMap
from daskhps.training.model_input import BagPooling, sparse_input

DIM = 5


def _grads(keys: torch.Tensor, offsets: torch.Tensor | None, seed: int, fast: bool):
    """Forward output and leaf gradient of sparse_input, through the grouped backward
    (``fast``) or the plain index_select backward (the routing without its groups)."""
    routing = Exchange(None, ShardMap(8, 1)).route(keys)
    if not fast:
        routing = dataclasses.replace(routing, order=None, offsets=None)
    gen = torch.Generator().manual_seed(seed)
    leaf = torch.randn(len(routing.keys), DIM, generator=gen).requires_grad_(True)
    nf = keys.shape[1] if offsets is None else 3
    pooling = None if offsets is None else BagPooling("sum", nf)
    out = sparse_input(leaf, routing, offsets, pooling)
    upstream = torch.randn(out.shape, generator=gen)
    upstream[upstream.abs() < 0.3] = -0.0  # negative zeros and exact cancellations too
    (out * upstream).sum().backward()
    assert leaf.grad is not None
    return out.detach(), leaf.grad


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 6),
    st.integers(1, 30),
    st.integers(0, 2**31),
)
def test_grouped_backward_equals_index_add_bit_for_bit(
    n: int, fields: int, vocab: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randint(-vocab, vocab, (n, fields), generator=gen) * 1_000_003
    fast_out, fast = _grads(keys, None, seed, fast=True)
    slow_out, slow = _grads(keys, None, seed, fast=False)
    assert torch.equal(_bits(fast_out), _bits(slow_out))
    assert torch.equal(_bits(fast), _bits(slow))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=6, max_size=30), st.integers(0, 2**31))
def test_grouped_backward_with_bags(lengths: list[int], seed: int) -> None:
    lengths = lengths[: len(lengths) // 3 * 3]  # whole examples of 3 fields
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    keys = torch.randint(0, 12, (int(offsets[-1]),), generator=gen)
    fast_out, fast = _grads(keys, offsets, seed, fast=True)
    slow_out, slow = _grads(keys, offsets, seed, fast=False)
    assert torch.equal(_bits(fast_out), _bits(slow_out))
    assert torch.equal(_bits(fast), _bits(slow))


def test_grouped_backward_on_a_ctr_sized_batch_with_threads() -> None:
    """Zipf-like keys of 4,096 examples x 26 fields, with the threads the trainer uses."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    try:
        gen = torch.Generator().manual_seed(1)
        ranks = torch.rand(4096, 26, generator=gen).pow(-1.2).long()  # heavy head, long tail
        keys = ranks * 26 + torch.arange(26)
        fast_out, fast = _grads(keys, None, 3, fast=True)
        slow_out, slow = _grads(keys, None, 3, fast=False)
        assert torch.equal(_bits(fast), _bits(slow))
        assert torch.equal(_bits(fast_out), _bits(slow_out))
    finally:
        torch.set_num_threads(threads)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=2, max_size=5), st.integers(1, 12), st.integers(0, 99))
def test_fields_of_different_widths_read_their_own_columns(widths, n, seed):
    """With tables of different widths, the padded rows' gather gives each field exactly its
    row's first ``width`` floats, in field order, and their gradients reach those floats only."""
    from daskhps.training.model_input import field_columns

    widths = tuple(widths)
    gen = torch.Generator().manual_seed(seed)
    nf, widest = len(widths), max(widths)
    keys = torch.randint(0, 7, (n, nf), generator=gen) * 11 + torch.arange(nf)
    routing = Exchange(None, ShardMap(8, 1)).route(keys)
    leaf = torch.randn(len(routing.keys), widest, generator=gen).requires_grad_(True)
    columns = field_columns(widths)
    out = sparse_input(leaf, routing, None, None, columns)
    if columns is None:  # one width: the [n, F, D] layout stays
        assert min(widths) == widest and out.shape == (n, nf, widest)
        return
    rows = leaf.detach()[routing.inverse]  # [n, F, widest]
    want = torch.cat([rows[:, f, :w] for f, w in enumerate(widths)], dim=1)
    assert torch.equal(out, want)
    out.sum().backward()
    assert leaf.grad is not None
    used = torch.zeros_like(leaf, dtype=torch.bool)
    for f, w in enumerate(widths):
        used[routing.inverse[:, f], :w] = True
    assert (leaf.grad[~used] == 0).all() and (leaf.grad[used] > 0).all()

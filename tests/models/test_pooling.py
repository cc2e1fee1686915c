"""pool() against torch.nn.functional.embedding_bag, over random bag layouts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.errors import ConfigError, DataError
from daskhps.models import pool


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()])


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), min_size=1, max_size=40),
    dim=st.integers(1, 9),
    mode=st.sampled_from(["sum", "mean"]),
    seed=st.integers(0, 2**16),
)
def test_pool_matches_embedding_bag(lengths: list[int], dim: int, mode: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    offsets = _offsets(lengths)
    n = int(offsets[-1])
    rows = torch.randn(n, dim, generator=gen, requires_grad=True)
    # embedding_bag over the identity index list is the reference: bag i sums rows[o_i:o_i+1].
    weight = rows.detach().clone().requires_grad_(True)
    got = pool(rows, offsets, mode)  # type: ignore[arg-type]
    want = F.embedding_bag(torch.arange(n), weight, offsets, mode=mode, include_last_offset=True)
    assert got.shape == (len(lengths), dim)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    empty = torch.tensor(lengths) == 0
    assert torch.all(got[empty] == 0)

    upstream = torch.randn(got.shape, generator=gen)
    got.backward(upstream)
    want.backward(upstream)
    if n:
        torch.testing.assert_close(rows.grad, weight.grad, rtol=1e-5, atol=1e-6)


def test_pool_reshapes_to_model_input() -> None:
    # B=2 examples, F=3 fields, example-major bags: bag i is (example i // 3, field i % 3).
    lengths = [2, 1, 0, 1, 3, 1]
    rows = torch.arange(8, dtype=torch.float32).unsqueeze(1).repeat(1, 4)
    out = pool(rows, _offsets(lengths), "sum").view(2, 3, 4)
    assert out[:, :, 0].tolist() == [[0 + 1, 2, 0], [3, 4 + 5 + 6, 7]]


def test_pool_all_empty_and_no_bags() -> None:
    rows = torch.zeros(0, 3)
    assert torch.equal(pool(rows, torch.zeros(5, dtype=torch.int64), "mean"), torch.zeros(4, 3))
    assert pool(rows, torch.zeros(1, dtype=torch.int64)).shape == (0, 3)


@pytest.mark.parametrize(
    ("rows", "offsets", "match"),
    [
        (torch.zeros(3), torch.tensor([0, 3]), "2-d"),
        (torch.zeros(3, 2), torch.tensor([0, 3], dtype=torch.int32), "int64"),
        (torch.zeros(3, 2), torch.zeros(0, dtype=torch.int64), "num_bags"),
        (torch.zeros(3, 2), torch.tensor([[0, 3]]), "1-d"),
        (torch.zeros(3, 2), torch.tensor([1, 3]), "start at 0"),
        (torch.zeros(3, 2), torch.tensor([0, 2]), "end at len"),
        (torch.zeros(3, 2), torch.tensor([0, 2, 1, 3]), "non-decreasing"),
    ],
)
def test_pool_rejects_bad_input(rows: torch.Tensor, offsets: torch.Tensor, match: str) -> None:
    with pytest.raises(DataError, match=match):
        pool(rows, offsets)


def test_pool_rejects_unknown_mode() -> None:
    with pytest.raises(ConfigError, match="'max'"):
        pool(torch.zeros(1, 2), torch.tensor([0, 1]), "max")  # type: ignore[arg-type]

"""KeyWidths and the packing of rows of different widths against a per-row model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.distributed import KeyWidths
from daskhps.distributed.widths import columns, pack_rows, split_floats, unpack_rows
from daskhps.errors import ConfigError, DataError


@st.composite
def packed_cases(draw: st.DrawFn) -> tuple[KeyWidths, torch.Tensor, torch.Tensor, list[int]]:
    """Widths of 1 to 4 tables, keys of those tables, rows of the widest table, and the keys
    split into consecutive groups (one per rank, empty ones included)."""
    dims = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    tables = draw(st.lists(st.integers(0, len(dims) - 1), max_size=30))
    lows = draw(st.lists(st.integers(0, 2**56 - 1), min_size=len(tables), max_size=len(tables)))
    keys = torch.tensor([(t << 56) | low for t, low in zip(tables, lows, strict=True)])
    keys = keys.to(torch.int64)
    seed = draw(st.integers(0, 2**32 - 1))
    rows = torch.randn(len(keys), max(dims), generator=torch.Generator().manual_seed(seed))
    cuts = sorted(draw(st.lists(st.integers(0, len(keys)), max_size=3)))
    counts = [b - a for a, b in zip([0, *cuts], [*cuts, len(keys)], strict=True)]
    return KeyWidths(dims), keys, rows, counts


@settings(max_examples=150, deadline=None)
@given(packed_cases())
def test_packing_keeps_each_keys_first_width_floats(case) -> None:
    kw, keys, rows, counts = case
    widths = [kw.dims[k >> 56] for k in keys.tolist()]
    assert kw.of(keys).tolist() == widths
    assert kw.mask(keys).sum(1).tolist() == widths
    flat = pack_rows(rows, kw.of(keys))
    parts = [rows[i, :w] for i, w in enumerate(widths)]
    assert torch.equal(flat, torch.cat(parts) if parts else torch.zeros(0))
    want = torch.zeros_like(rows)
    for i, w in enumerate(widths):
        want[i, :w] = rows[i, :w]
    assert torch.equal(unpack_rows(flat, kw.of(keys), kw.widest), want)
    starts = [sum(counts[:j]) for j in range(len(counts))]
    split = [sum(widths[s : s + c]) for s, c in zip(starts, counts, strict=True)]
    assert split_floats(kw.of(keys), counts) == split


def test_widths_of_keys_keep_the_shape_and_mask_the_columns() -> None:
    kw = KeyWidths([3, 1])
    keys = torch.tensor([[7, (1 << 56) | 7], [0, 1 << 56]])
    assert kw.of(keys).tolist() == [[3, 1], [3, 1]]
    assert (kw.widest, kw.uniform, KeyWidths([2, 2]).uniform) == (3, False, True)
    assert columns(torch.tensor([0, 2]), 3).tolist() == [[False] * 3, [True, True, False]]
    assert kw == KeyWidths((3, 1)) and hash(kw) == hash(KeyWidths((3, 1)))


@pytest.mark.parametrize(
    ("dims", "message"),
    [
        ([], "0 tables; a run has 1 to 127"),
        ([4] * 128, "128 tables; a run has 1 to 127"),
        ([4, 0], "table 1 has row width 0"),
        ([2.5], "table 0 has row width 2.5"),
        ([True], "table 0 has row width True"),
    ],
)
def test_bad_dims_are_one_clear_line(dims, message) -> None:
    with pytest.raises(ConfigError, match=message):
        KeyWidths(dims)


def test_a_key_of_an_unknown_table_is_named() -> None:
    kw = KeyWidths([3, 1])
    with pytest.raises(DataError, match=f"key {(5 << 56) | 9} has table index 5 .* tables 0..1"):
        kw.of(torch.tensor([1, (5 << 56) | 9, 2]))
    with pytest.raises(DataError, match="key -1 has table index -1"):
        kw.of(torch.tensor([-1]))

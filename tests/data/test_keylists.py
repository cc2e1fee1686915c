"""Multi-hot key columns packed for a shuffle come back as the same lists."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from daskhps.data.keylists import (
    key_list_columns,
    pack_key_lists,
    packed_meta,
    unpack_key_lists,
)
from daskhps.data.parse import KEY_LIST

CELLS: list[Any] = [[1, 2, 3], [], None, [-4], [5, 5], [2**62], None, []]


def _frame(list_type: pa.DataType) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "ad": np.arange(len(CELLS), dtype=np.int64),
            "tags": pd.arrays.ArrowExtensionArray(pa.array(CELLS, list_type)),
            "words": pd.Series(["a"] * len(CELLS), dtype="string[pyarrow]"),
        }
    )


def _cells(col: pd.Series) -> list[Any]:
    return [None if v is None or v is pd.NA else [int(k) for k in v] for v in col.tolist()]


@pytest.mark.parametrize("list_type", [KEY_LIST.pyarrow_dtype, pa.large_list(pa.int64())])
def test_pack_then_unpack_gives_the_same_lists(list_type: pa.DataType) -> None:
    df = _frame(list_type)
    lists = key_list_columns(df)
    assert lists == {"tags": list_type}  # neither the int64 nor the string column
    packed = pack_key_lists(df, lists)
    assert packed["tags"].dtype == pd.ArrowDtype(pa.large_binary())
    assert packed["tags"].isna().tolist() == df["tags"].isna().tolist()
    back = unpack_key_lists(packed, lists)
    assert back["tags"].dtype == df["tags"].dtype
    assert _cells(back["tags"]) == CELLS
    assert back["ad"].tolist() == df["ad"].tolist()


def test_slices_and_arrow_round_trips_keep_each_rows_keys() -> None:
    """What a shuffle does: slice partitions, send them as Arrow tables, concatenate."""
    df = _frame(KEY_LIST.pyarrow_dtype)
    lists = key_list_columns(df)
    pieces = [pack_key_lists(df.iloc[a:b], lists) for a, b in ((3, 8), (0, 3))]
    tables = [pa.Table.from_pandas(p.iloc[1:] if i else p) for i, p in enumerate(pieces)]
    # the dtype of every column is rebuilt from its name, as Dask's p2p shuffle does
    moved = pa.concat_tables(tables).to_pandas()
    back = unpack_key_lists(moved, lists)
    assert _cells(back["tags"]) == CELLS[3:8] + CELLS[1:3]
    assert back["ad"].tolist() == [3, 4, 5, 6, 7, 1, 2]
    # the slice of a packed column unpacks on its own too
    assert _cells(unpack_key_lists(moved.iloc[2:4], lists)["tags"]) == CELLS[5:7]


def test_packed_meta_matches_packed_frames() -> None:
    df = _frame(KEY_LIST.pyarrow_dtype)
    lists = key_list_columns(df)
    meta = packed_meta(df, lists)
    assert len(meta) == 0
    assert meta.dtypes.to_dict() == pack_key_lists(df, lists).dtypes.to_dict()
    assert packed_meta(df, {}) is df

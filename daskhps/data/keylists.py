"""Multi-hot key columns packed into a form every Dask shuffle carries.

A multi-hot column is an Arrow ``list<int64>`` column (``pd.ArrowDtype``). Dask's p2p shuffle
sends partitions as Arrow tables and rebuilds each dtype from its *name*, which pandas cannot
parse back for nested types (``data type 'list<item: int64>[pyarrow]' not understood``), so a
frame with such a column fails to shuffle across workers. Before a shuffle each list column
becomes ``large_binary`` (a dtype whose name round-trips), one value per row holding that
row's keys as raw int64 bytes; afterwards the bytes become lists again::

    list<int64>    [7, 8]        []      null          <- offsets 0 2 2 2 (keys), values 7 8
    large_binary   b'<7><8>'     b''     null          <- offsets 0 16 16 16 (bytes), same data

Both directions reuse the Arrow buffers (offsets times 8, the values as bytes): no Python
loop over rows, and a null list stays null.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from daskhps.errors import DataError

__all__ = ["key_list_columns", "pack_key_lists", "packed_meta", "unpack_key_lists"]

_WIDTH = 8  # bytes per int64 key
_PACKED = pd.ArrowDtype(pa.large_binary())


def key_list_columns(meta: pd.DataFrame) -> dict[str, pa.DataType]:
    """The Arrow list-of-int64 columns of a frame (or its meta), with their Arrow types."""
    out: dict[str, pa.DataType] = {}
    for name, dtype in meta.dtypes.items():
        if not isinstance(dtype, pd.ArrowDtype):
            continue
        t = dtype.pyarrow_dtype
        if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_int64(t.value_type):
            out[str(name)] = t
    return out


def _arrow(col: pd.Series, type_: pa.DataType) -> pa.Array:
    arr = pa.array(col.array, type=type_, from_pandas=True)
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _pack(col: pd.Series, type_: pa.DataType) -> pd.Series:
    arr = _arrow(col, type_)
    flat = pc.list_flatten(arr)  # the keys of the non-null lists, honouring slices
    if flat.null_count:
        raise DataError(f"multi-hot column {col.name!r}: a list holds a null key")
    keys = np.ascontiguousarray(flat.to_numpy(zero_copy_only=False), dtype=np.int64)
    lengths = np.asarray(pc.fill_null(pc.list_value_length(arr), 0), dtype=np.int64)
    offsets = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum(lengths * _WIDTH, out=offsets[1:])
    validity = pa.array(np.asarray(pc.is_valid(arr))).buffers()[1] if arr.null_count else None
    packed = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(),
        len(arr),
        [validity, pa.py_buffer(offsets), pa.py_buffer(keys)],
        arr.null_count,
    )
    return pd.Series(pd.arrays.ArrowExtensionArray(packed), index=col.index, name=col.name)


def _unpack(col: pd.Series, type_: pa.DataType) -> pd.Series:
    arr = _arrow(col, pa.large_binary())
    _, offs_buf, data_buf = arr.buffers()
    n = len(arr)
    offsets = np.frombuffer(offs_buf, dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    count = int(offsets[-1] - offsets[0]) // _WIDTH
    keys = (
        np.frombuffer(data_buf, dtype=np.int64, count=count, offset=int(offsets[0]))
        if count
        else np.zeros(0, dtype=np.int64)
    )
    list_offsets = (offsets - offsets[0]) // _WIDTH
    build = pa.LargeListArray if pa.types.is_large_list(type_) else pa.ListArray
    index_type = pa.int64() if pa.types.is_large_list(type_) else pa.int32()
    lists = build.from_arrays(
        pa.array(list_offsets, type=index_type),
        pa.array(keys, type=pa.int64()),
        type=type_,
        mask=pc.is_null(arr) if arr.null_count else None,
    )
    return pd.Series(pd.arrays.ArrowExtensionArray(lists), index=col.index, name=col.name)


def pack_key_lists(df: pd.DataFrame, columns: Mapping[str, pa.DataType]) -> pd.DataFrame:
    """``df`` with each of ``columns`` (from :func:`key_list_columns`) packed to bytes."""
    if not columns:
        return df
    return df.assign(**{c: _pack(df[c], t) for c, t in columns.items()})


def unpack_key_lists(df: pd.DataFrame, columns: Mapping[str, pa.DataType]) -> pd.DataFrame:
    """Undo :func:`pack_key_lists`: each of ``columns`` back to its Arrow list type."""
    if not columns:
        return df
    return df.assign(**{c: _unpack(df[c], t) for c, t in columns.items()})


def packed_meta(meta: pd.DataFrame, columns: Mapping[str, pa.DataType]) -> pd.DataFrame:
    """The meta of a frame after :func:`pack_key_lists`."""
    if not columns:
        return meta
    meta = meta.iloc[:0]
    return meta.assign(**{c: pd.Series([], dtype=_PACKED, index=meta.index) for c in columns})

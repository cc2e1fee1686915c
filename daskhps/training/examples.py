"""Examples of a pass, routed to the worker that trains them, and cut into mini-batches there.

::

    pass positions   start ............................................ stop
    training order   rank 0 1 2 ...                          (the plan's order: shuffled or not)
    global batches   | b0: ranks 0..B-1 | b1: B..2B-1 | ...
    worker shares    | w0 | w1 | ... |        (split_batch: sizes differ by at most one)

Each row gets its ``_rank`` in the pass's training order and the worker that trains it; a
``set_index`` on the worker with explicit divisions puts exactly worker ``w``'s rows in
partition ``w`` (Dask's hash shuffle would not), which is then pinned on worker ``w``. There the
rows, sorted by rank, are cut into the worker's share of every global batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import torch

from daskhps.data.hashing import missing_key
from daskhps.data.keylists import key_list_columns, pack_key_lists, packed_meta, unpack_key_lists
from daskhps.data.schema import LABEL, Schema
from daskhps.errors import DataError
from daskhps.monitor.network import SOURCE, RouteAccount, account_shuffled
from daskhps.passes.keys import pass_partitions

__all__ = ["WorkerExamples", "bag_keys", "route_examples", "worker_of_rank"]

RANK = "daskhps_rank"
WORKER = "daskhps_worker"  # not "_worker": the p2p shuffle uses that name itself


def worker_of_rank(rank: np.ndarray, n: int, batch_size: int, num_workers: int) -> np.ndarray:
    """Worker that trains each training-order rank of a pass of ``n`` examples (the same
    split as :func:`daskhps.passes.split_batch`, vectorised)."""
    b = rank // batch_size
    off = rank - b * batch_size
    size = np.minimum(batch_size, n - b * batch_size)
    base, extra = size // num_workers, size % num_workers
    big = extra * (base + 1)
    return np.where(
        off < big, off // (base + 1), extra + (off - big) // np.maximum(base, 1)
    ).astype(np.int64)


def _tag(
    df: pd.DataFrame,
    bounds: dict[int, tuple[int, int, int]],
    start: int,
    rank_of: np.ndarray | None,
    n: int,
    batch_size: int,
    num_workers: int,
    lists: Mapping[str, pa.DataType],
    account: RouteAccount | None = None,
    partition_info: Any = None,
) -> pd.DataFrame:
    lo, hi, first_pos = bounds[partition_info["number"]]
    df = df.iloc[lo:hi]
    pos = np.arange(first_pos, first_pos + len(df), dtype=np.int64) - start
    rank = pos if rank_of is None else rank_of[pos]
    out = df.copy()
    out[RANK] = rank
    out[WORKER] = worker_of_rank(rank, n, batch_size, num_workers)
    if account is not None:  # the rank the rows leave from, for the network figures
        out[SOURCE] = np.int16(account.rank_here())
    return pack_key_lists(out, lists)


def _sort(
    df: pd.DataFrame,
    lists: Mapping[str, pa.DataType],
    account: RouteAccount | None = None,
    partition_info: Any = None,
) -> pd.DataFrame:
    if account is not None and partition_info is not None:
        df = account_shuffled(account, "examples", df, partition_info["number"])
    return unpack_key_lists(df.sort_values(RANK).reset_index(drop=True), lists)


def route_examples(
    frame: dd.DataFrame,
    lengths: Sequence[int],
    start: int,
    stop: int,
    *,
    batch_size: int,
    num_workers: int,
    order: np.ndarray | None = None,
    account: RouteAccount | None = None,
) -> dd.DataFrame:
    """Rows at plan positions ``[start, stop)`` in ``num_workers`` partitions, partition ``w``
    holding worker ``w``'s rows sorted by their rank in the training order.

    ``order`` lists the positions in training order (a shuffled pass); None keeps plan order.
    With ``account``, the bytes the rows take between ranks are counted (kind ``examples``).
    """
    n = stop - start
    if n <= 0:
        raise DataError(f"route_examples: empty range [{start}, {stop})")
    where, sub_lengths, begin = pass_partitions(lengths, start, stop)
    bounds = {}
    for j, rows in enumerate(sub_lengths):
        lo = max(start - begin, 0)
        bounds[j] = (lo, min(stop, begin + rows) - begin, begin + lo)
        begin += rows
    rank_of = None
    if order is not None:
        rank_of = np.empty(n, dtype=np.int64)
        rank_of[np.asarray(order, dtype=np.int64) - start] = np.arange(n, dtype=np.int64)
    sub = frame.partitions[where]
    meta = frame._meta.assign(**{RANK: np.int64(0), WORKER: np.int64(0)}).iloc[:0]
    # Multi-hot columns cross the shuffle packed as bytes: p2p cannot rebuild Arrow list
    # dtypes on the receiving worker (see daskhps.data.keylists).
    lists = key_list_columns(meta)
    sent = meta if account is None else meta.assign(**{SOURCE: np.int16(0)}).iloc[:0]
    tagged = sub.map_partitions(
        _tag,
        bounds,
        start,
        rank_of,
        n,
        batch_size,
        num_workers,
        lists,
        account,
        meta=packed_meta(sent, lists),
    )
    routed = tagged.set_index(WORKER, divisions=list(range(num_workers + 1)))
    return routed.map_partitions(
        _sort, lists, account, meta=meta.drop(columns=[WORKER]).reset_index(drop=True)
    )


def _list_column(col: pd.Series, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(length of each row's list, values of all lists in row order) of a multi-hot column.

    Takes Arrow list columns as well as object columns of Python lists or arrays; a null
    cell has length 0.
    """
    arr = pa.array(col, type=pa.list_(pa.int64()), from_pandas=True)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    lengths = np.asarray(pc.fill_null(pc.list_value_length(arr), 0), dtype=np.int64)
    flat = arr.flatten()  # values of the non-null lists only, honouring slices
    if flat.null_count:
        raise DataError(f"multi-hot field {name!r}: a list holds a null key; parse the log first")
    return lengths, np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.int64)


def bag_keys(df: pd.DataFrame, schema: Schema) -> tuple[np.ndarray, np.ndarray]:
    """Every key of ``df``'s rows as CSR bags in example-major order (bag ``i`` is field
    ``i % F`` of row ``i // F``, the order :func:`daskhps.models.pool` expects).

    Returns ``(keys int64[N], offsets int64[n * F + 1])``. A single-hot field gives one key per
    row; an empty or missing multi-hot cell gives ``[missing key of the field]``, as the parser
    does, so no bag is empty.
    """
    n, fields = len(df), schema.categorical
    nf = len(fields)
    bag_len = np.ones((n, nf), dtype=np.int64)
    lists: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for j, f in enumerate(fields):
        if f.multi_hot:
            lens, vals = _list_column(df[f.name], f.name)
            lists[j] = (lens, vals)
            bag_len[:, j] = np.maximum(lens, 1)
    offsets = np.zeros(n * nf + 1, dtype=np.int64)
    np.cumsum(bag_len.reshape(-1), out=offsets[1:])
    keys = np.empty(int(offsets[-1]), dtype=np.int64)
    bag_start = offsets[:-1].reshape(n, nf)
    for j, f in enumerate(fields):
        if j not in lists:
            keys[bag_start[:, j]] = df[f.name].to_numpy(dtype=np.int64)
            continue
        lens, vals = lists[j]
        # Value k of row i lands at bag_start[i, j] + k: shift each row's run of values from
        # its place in the field's flat list to its bag.
        list_start = np.cumsum(lens) - lens
        keys[np.arange(len(vals)) + np.repeat(bag_start[:, j] - list_start, lens)] = vals
        keys[bag_start[lens == 0, j]] = missing_key(f.name)
    return keys, offsets


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``a``'s memory, or of a copy when pandas handed out a read-only view
    (copy-on-write): torch must not alias memory it may not write."""
    return torch.from_numpy(a if a.flags.writeable else a.copy())


@dataclass
class WorkerExamples:
    """One worker's rows of a pass as tensors, cut into its share of each global batch.

    ::

        rows (sorted by rank)   r0 r1 r2 | r3 r4 | ...
        batch of each row       0  0  0  | 1  1  | ...     rank // global batch size
        batch(b)  ->  (dense[n_b, D], keys, offsets, labels[n_b])

    Single-hot schemas keep ``keys`` as ``int64[n, F]`` and ``offsets`` None. With a multi-hot
    field, ``keys`` is every key flat (``int64[N]``) and ``offsets`` (``int64[n * F + 1]``) cuts
    it into example-major bags; :meth:`batch` rebases a batch's offsets to start at 0.
    """

    dense: torch.Tensor
    keys: torch.Tensor
    labels: torch.Tensor
    starts: np.ndarray  # row index where each global batch begins (length num_batches + 1)
    offsets: torch.Tensor | None = None
    num_fields: int = 0

    @classmethod
    def from_frame(
        cls, df: pd.DataFrame, schema: Schema, batch_size: int, num_batches: int
    ) -> WorkerExamples:
        dense_cols = list(schema.dense_names)
        cat_cols = list(schema.categorical_names)
        dense = df[dense_cols].to_numpy(dtype=np.float32) if dense_cols else None
        n = len(df)
        rank = df[RANK].to_numpy(dtype=np.int64) if n else np.zeros(0, np.int64)
        starts = np.searchsorted(rank // batch_size, np.arange(num_batches + 1), side="left")
        offsets = None
        if any(f.multi_hot for f in schema.categorical):
            flat, offs = bag_keys(df, schema)
            keys = _tensor(flat)
            offsets = _tensor(offs)
        else:
            keys = _tensor(np.ascontiguousarray(df[cat_cols].to_numpy(dtype=np.int64)))
        return cls(
            dense=_tensor(dense) if dense is not None else torch.zeros(n, 0),
            keys=keys,
            labels=_tensor(df[LABEL].to_numpy(dtype=np.float32)),
            starts=starts,
            offsets=offsets,
            num_fields=len(cat_cols),
        )

    @property
    def num_examples(self) -> int:
        return int(self.labels.shape[0])

    def batch(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``(dense, keys, offsets, labels)`` of this worker's share of global batch ``b``."""
        lo, hi = int(self.starts[b]), int(self.starts[b + 1])
        if self.offsets is None:
            return self.dense[lo:hi], self.keys[lo:hi], None, self.labels[lo:hi]
        offs = self.offsets[lo * self.num_fields : hi * self.num_fields + 1]
        first = offs[0]
        keys = self.keys[int(first) : int(offs[-1])]
        return self.dense[lo:hi], keys, offs - first, self.labels[lo:hi]

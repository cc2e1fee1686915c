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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
import torch

from daskhps.data.schema import LABEL, Schema
from daskhps.errors import DataError

__all__ = ["WorkerExamples", "route_examples", "worker_of_rank"]

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
    partition_info: Any = None,
) -> pd.DataFrame:
    lo, hi, first_pos = bounds[partition_info["number"]]
    df = df.iloc[lo:hi]
    pos = np.arange(first_pos, first_pos + len(df), dtype=np.int64) - start
    rank = pos if rank_of is None else rank_of[pos]
    out = df.copy()
    out[RANK] = rank
    out[WORKER] = worker_of_rank(rank, n, batch_size, num_workers)
    return out


def _sort(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(RANK).reset_index(drop=True)


def route_examples(
    frame: dd.DataFrame,
    lengths: Sequence[int],
    start: int,
    stop: int,
    *,
    batch_size: int,
    num_workers: int,
    order: np.ndarray | None = None,
) -> dd.DataFrame:
    """Rows at plan positions ``[start, stop)`` in ``num_workers`` partitions, partition ``w``
    holding worker ``w``'s rows sorted by their rank in the training order.

    ``order`` lists the positions in training order (a shuffled pass); None keeps plan order.
    """
    n = stop - start
    if n <= 0:
        raise DataError(f"route_examples: empty range [{start}, {stop})")
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    begins = ends - np.asarray(lengths, dtype=np.int64)
    first = int(np.searchsorted(ends, start, side="right"))
    last = int(np.searchsorted(begins, stop, side="left"))
    bounds = {}
    for j, i in enumerate(range(first, last)):
        lo = max(start - int(begins[i]), 0)
        hi = min(stop, int(ends[i])) - int(begins[i])
        bounds[j] = (lo, hi, int(begins[i]) + lo)
    rank_of = None
    if order is not None:
        rank_of = np.empty(n, dtype=np.int64)
        rank_of[np.asarray(order, dtype=np.int64) - start] = np.arange(n, dtype=np.int64)
    sub = frame.partitions[first:last]
    meta = frame._meta.assign(**{RANK: np.int64(0), WORKER: np.int64(0)}).iloc[:0]
    tagged = sub.map_partitions(_tag, bounds, start, rank_of, n, batch_size, num_workers, meta=meta)
    routed = tagged.set_index(WORKER, divisions=list(range(num_workers + 1)))
    return routed.map_partitions(_sort, meta=meta.drop(columns=[WORKER]).reset_index(drop=True))


@dataclass
class WorkerExamples:
    """One worker's rows of a pass as tensors, cut into its share of each global batch.

    ::

        rows (sorted by rank)   r0 r1 r2 | r3 r4 | ...
        batch of each row       0  0  0  | 1  1  | ...     rank // global batch size
        batch(b)  ->  (dense[n_b, D], keys[n_b, F], labels[n_b])
    """

    dense: torch.Tensor
    keys: torch.Tensor
    labels: torch.Tensor
    starts: np.ndarray  # row index where each global batch begins (length num_batches + 1)

    @classmethod
    def from_frame(
        cls, df: pd.DataFrame, schema: Schema, batch_size: int, num_batches: int
    ) -> WorkerExamples:
        multi = [f.name for f in schema.categorical if f.multi_hot]
        if multi:
            raise DataError(
                f"multi-hot fields {multi} are not supported by the trainer yet; "
                "list them as single-valued categorical fields or drop them from the schema"
            )
        dense_cols = list(schema.dense_names)
        cat_cols = list(schema.categorical_names)
        dense = df[dense_cols].to_numpy(dtype=np.float32) if dense_cols else None
        n = len(df)
        rank = df[RANK].to_numpy(dtype=np.int64) if n else np.zeros(0, np.int64)
        starts = np.searchsorted(rank // batch_size, np.arange(num_batches + 1), side="left")
        return cls(
            dense=torch.from_numpy(dense) if dense is not None else torch.zeros(n, 0),
            keys=torch.from_numpy(np.ascontiguousarray(df[cat_cols].to_numpy(dtype=np.int64))),
            labels=torch.from_numpy(df[LABEL].to_numpy(dtype=np.float32)),
            starts=starts,
        )

    @property
    def num_examples(self) -> int:
        return int(self.labels.shape[0])

    def batch(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lo, hi = int(self.starts[b]), int(self.starts[b + 1])
        return self.dense[lo:hi], self.keys[lo:hi], self.labels[lo:hi]

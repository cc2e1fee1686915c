"""The keys of a pass: the rows at plan positions ``[start, stop)``, their keys deduplicated
within each partition.

Its own module because both sides of planning need it: :mod:`~daskhps.passes.plan` counts a
pass's keys to split it under ``max_working_set``, :mod:`~daskhps.passes.owners` routes them to
their owners (and needs the plan's types), so neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa

from daskhps.data.readers import ClickLog
from daskhps.stages import stage_span
from daskhps.table.stats import NO_DAY, day_number

__all__ = ["KEY_COLUMNS", "pass_keys", "pass_partitions", "select_examples", "unique_counts"]


def _slice(df: Any, bounds: dict[int, tuple[int, int]], partition_info: Any = None) -> Any:
    lo, hi = bounds[partition_info["number"]]
    return df.iloc[lo:hi]


def pass_partitions(
    lengths: Sequence[int], start: int, stop: int
) -> tuple[slice, tuple[int, ...], int]:
    """The partitions that hold plan positions ``[start, stop)``: their slice, their lengths
    and the plan position of their first row (so positions shift to the sub-frame's)."""
    ends = np.cumsum(lengths)
    begins = ends - np.asarray(lengths)
    first = int(np.searchsorted(ends, start, side="right"))
    last = int(np.searchsorted(begins, stop, side="left"))  # exclusive
    first = min(first, max(last - 1, 0))
    last = max(last, first + 1)
    return slice(first, last), tuple(int(n) for n in lengths[first:last]), int(begins[first])


def select_examples(
    frame: dd.DataFrame, lengths: Sequence[int], start: int, stop: int
) -> dd.DataFrame:
    """Rows at plan positions ``[start, stop)`` of a frame with the given partition lengths."""
    where, sub_lengths, begin = pass_partitions(lengths, start, stop)
    bounds = {}
    for j, n in enumerate(sub_lengths):
        bounds[j] = (max(start - begin, 0), min(stop, begin + n) - begin)
        begin += n
    sub = frame.partitions[where]
    return sub.map_partitions(_slice, bounds, meta=frame._meta)


def unique_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_counts=True)`` of int64 values, from a hash table instead of
    a sort of every value: a partition's keys repeat (26 fields of 250,000 rows, 180,000
    distinct), so sorting only the distinct ones is 4 to 6 times faster."""
    codes, uniq = pd.factorize(values, sort=False)
    counts = np.bincount(codes, minlength=len(uniq)).astype(np.int64, copy=False)
    order = np.argsort(uniq, kind="stable")
    return uniq[order], counts[order]


def _local_keys(
    df: Any,
    fields: tuple[str, ...],
    multi: tuple[str, ...],
    days: tuple[int, ...],
    partition_info: Any = None,
) -> Any:
    """All keys of a partition, deduplicated locally (cuts shuffle volume), with how often
    each occurs and the partition's day (one ``days`` entry per partition)."""
    with stage_span("dedup"):
        arrays = [np.asarray(df[f].to_numpy(), dtype=np.int64) for f in fields]
        for f in multi:
            col = df[f]
            if isinstance(col, pd.Series):
                flat = pa.array(col.array).flatten()
            else:  # cudf: the list column's values
                flat = col.list.leaves.to_arrow()
            arrays.append(np.asarray(flat, dtype=np.int64))
        every = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
        keys, counts = unique_counts(every)
        day = np.full(len(keys), days[partition_info["number"]], dtype=np.int32)
        return pd.DataFrame({"key": keys, "count": counts, "day": day})


KEY_COLUMNS = {"key": "int64", "count": "int64", "day": "int32"}


def pass_keys(log_: ClickLog, lengths: Sequence[int], start: int, stop: int) -> dd.DataFrame:
    """Keys of the examples at plan positions ``[start, stop)``, unique within each partition:
    columns ``key``, ``count`` (occurrences in the partition's rows of the pass) and ``day``
    (the partition's log day, a :func:`~daskhps.table.stats.day_number`, or ``NO_DAY``)."""
    where, _, _ = pass_partitions(lengths, start, stop)
    days = tuple(NO_DAY if d is None else day_number(d) for d in log_.part_days()[where])
    frame = select_examples(log_.frame, lengths, start, stop)
    single = tuple(c.name for c in log_.schema.categorical if not c.multi_hot)
    multi = tuple(c.name for c in log_.schema.categorical if c.multi_hot)
    meta = pd.DataFrame({k: pd.Series([], dtype=t) for k, t in KEY_COLUMNS.items()})
    return frame.map_partitions(_local_keys, single, multi, days, meta=meta)

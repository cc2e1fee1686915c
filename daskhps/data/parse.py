"""Parse one click-log shard (a file) into a frame of labels, dense values and int64 keys.

This is the per-partition work of the reader; it knows nothing about Dask. All checks are
vectorised (Arrow compute and numpy); Python only loops over columns.

One shard becomes::

    label  I1 ... I13   C1 ... C26
    f32    f32    f32   i64    i64      <- one row per good input line, in file order

and a :class:`BadRowReport` of what was dropped.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from daskhps.data.badrows import BadRowPolicy, BadRowReport, Reason
from daskhps.data.hashing import hash_column, missing_key
from daskhps.data.schema import LABEL, CategoricalField, DenseField, Schema
from daskhps.errors import DataError
from daskhps.monitor import stage_span

__all__ = ["empty_frame", "parse_table", "read_shard"]

log = logging.getLogger(__name__)

_NUMBER = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"
KEY_LIST = pd.ArrowDtype(pa.list_(pa.int64()))


@dataclass
class _Raw:
    """A shard as read: string (or typed) columns plus what the reader already rejected."""

    table: pa.Table
    lines: np.ndarray | None  # line number (text) or row number (parquet) of each table row
    invalid: list[tuple[int, str]]  # (line, what) of rows the reader dropped


def empty_frame(schema: Schema) -> pd.DataFrame:
    """A zero-row frame with the parsed dtypes (Dask's ``meta``)."""
    cols: dict[str, pd.Series] = {LABEL: pd.Series([], dtype="float32")}
    for d in schema.dense:
        cols[d.name] = pd.Series([], dtype="float32")
    for c in schema.categorical:
        cols[c.name] = pd.Series([], dtype=KEY_LIST if c.multi_hot else "int64")
    return pd.DataFrame(cols)


def _read_text(path: str, schema: Schema) -> _Raw:
    invalid: list[tuple[int, str]] = []

    def on_invalid(row: pacsv.InvalidRow) -> str:
        invalid.append(
            (
                int(row.number or 0),
                f"expected {row.expected_columns} columns, got {row.actual_columns}",
            )
        )
        return "skip"

    used = schema.used_columns
    read = pacsv.ReadOptions(
        use_threads=False,  # row numbers of invalid rows are only known single-threaded
        column_names=None if schema.header else list(schema.columns),
        autogenerate_column_names=False,
        block_size=1 << 20,  # small blocks stay in cache: faster than large ones here
    )
    parse = pacsv.ParseOptions(
        delimiter=schema.delimiter,
        quote_char='"' if schema.format == "csv" else False,
        ignore_empty_lines=False,  # keep line numbers true; blank lines are bad rows
        invalid_row_handler=on_invalid,
    )
    convert = pacsv.ConvertOptions(
        column_types={c: pa.string() for c in used},
        include_columns=list(used),
        strings_can_be_null=True,
        null_values=[""],
        quoted_strings_can_be_null=True,
    )
    with pa.input_stream(path, compression="detect") as stream:
        table = pacsv.read_csv(stream, read, parse, convert)
    first = 2 if schema.header else 1
    total = table.num_rows + len(invalid)
    lines = np.arange(first, first + total, dtype=np.int64)
    if invalid:
        lines = np.delete(lines, np.array([n for n, _ in invalid]) - first)
    return _Raw(table, lines, invalid)


def _read_parquet(path: str, schema: Schema) -> _Raw:
    table = pq.read_table(path, columns=list(schema.used_columns))
    return _Raw(table, np.arange(1, table.num_rows + 1, dtype=np.int64), [])


def _numeric(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(values as float64 with NaN for missing, mask of present-but-not-a-number)."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        try:
            num = pc.cast(col, pa.float64())
            bad = np.zeros(len(col), dtype=bool)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            ok = pc.fill_null(pc.match_substring_regex(col, _NUMBER), True)
            num = pc.cast(pc.if_else(ok, col, pa.scalar(None, pa.string())), pa.float64())
            bad = ~np.asarray(ok)
    elif pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
        num, bad = pc.cast(col, pa.float64()), np.zeros(len(col), dtype=bool)
    else:
        return np.full(len(col), np.nan), np.asarray(pc.is_valid(col))
    values = np.asarray(num.to_numpy(zero_copy_only=False), dtype=np.float64)
    # "nan"/"inf" parse as floats but are not usable feature values.
    bad |= np.isinf(values) | (np.isnan(values) & np.asarray(pc.is_valid(col)) & ~bad)
    return values, bad


def _label_ok(col: pa.ChunkedArray) -> np.ndarray:
    if (
        pa.types.is_integer(col.type)
        or pa.types.is_floating(col.type)
        or pa.types.is_boolean(col.type)
    ):
        col = pc.cast(col, pa.float64())
        return np.asarray(pc.fill_null(pc.is_in(col, pa.array([0.0, 1.0])), False))
    return np.asarray(pc.fill_null(pc.is_in(col, pa.array(["0", "1"])), False))


def _dense_out(values: np.ndarray, f: DenseField) -> np.ndarray:
    missing = np.isnan(values)
    if f.clip_min is not None or f.clip_max is not None:
        values = np.clip(values, f.clip_min, f.clip_max)
    if f.transform == "log1p":
        values = np.log1p(values)
    values[missing] = f.fill
    return values.astype(np.float32)


def _multi_hot(col: pa.ChunkedArray, f: CategoricalField) -> pd.Series:
    """Split, hash, and rebuild the lists; an empty or missing cell is ``[missing key]``."""
    assert f.separator is not None
    arr = pc.split_pattern(pc.cast(col, pa.string()), f.separator).combine_chunks()
    arr = pc.fill_null(arr, pa.scalar([], pa.list_(pa.string())))
    tokens = arr.flatten()
    keep = np.asarray(pc.fill_null(pc.not_equal(tokens, ""), False))
    row = np.repeat(np.arange(len(arr)), np.diff(np.asarray(arr.offsets)))[keep]
    keys = hash_column(tokens.filter(pa.array(keep)), f.name)
    counts = np.bincount(row, minlength=len(arr))
    empty = counts == 0
    # Rows without tokens get the field's missing key: insert it in row order.
    row = np.concatenate([row, np.flatnonzero(empty)])
    keys = np.concatenate([keys, np.full(int(empty.sum()), missing_key(f.name), np.int64)])
    order = np.argsort(row, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.maximum(counts, 1))]).astype(np.int32)
    lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(keys[order]))
    return pd.Series(pd.arrays.ArrowExtensionArray(lists), name=f.name)


def parse_table(
    raw: _Raw, schema: Schema, path: str, policy: BadRowPolicy
) -> tuple[pd.DataFrame, BadRowReport]:
    """Validate, drop or reject bad rows, then transform and hash the good ones."""
    table = raw.table
    n = table.num_rows
    reason = np.full(n, "", dtype=object)
    dense_bad_cols: list[tuple[str, np.ndarray]] = []

    present = np.zeros(n, dtype=bool)
    for c in schema.used_columns:
        present |= np.asarray(pc.is_valid(table[c]))
    blank = ~present  # a blank line: one empty field where many were expected
    label_bad = ~_label_ok(table[schema.label]) & ~blank
    dense_vals: dict[str, np.ndarray] = {}
    dense_bad = np.zeros(n, dtype=bool)
    for f in schema.dense:
        vals, bad = _numeric(table[f.name])
        dense_vals[f.name] = vals
        bad &= ~blank & ~label_bad
        if bad.any():
            dense_bad_cols.append((f.name, bad))
        dense_bad |= bad
    reason[dense_bad] = Reason.DENSE_NOT_NUMERIC
    reason[label_bad] = Reason.LABEL_INVALID
    reason[blank] = Reason.WRONG_COLUMN_COUNT
    bad = blank | label_bad | dense_bad

    counts: dict[tuple[str, str], int] = {}
    if raw.invalid:
        counts[(path, Reason.WRONG_COLUMN_COUNT)] = len(raw.invalid)
    for r in (Reason.WRONG_COLUMN_COUNT, Reason.LABEL_INVALID, Reason.DENSE_NOT_NUMERIC):
        k = int(np.count_nonzero(reason == r))
        if k:
            counts[(path, r)] = counts.get((path, r), 0) + k

    nbad = sum(counts.values())
    if nbad and policy.fail:
        raise DataError(_first_problem(raw, schema, path, reason, dense_bad_cols))
    total = n + len(raw.invalid)
    if nbad and total and nbad / total > policy.max_fraction:
        raise DataError(
            f"{path}: {nbad} of {total} rows are bad ({_fmt(counts)}), more than "
            f"max_fraction={policy.max_fraction}; is this the right schema?"
        )

    good = ~bad
    out: dict[str, object] = {}
    lab = table[schema.label]
    if pa.types.is_string(lab.type) or pa.types.is_large_string(lab.type):
        out[LABEL] = np.asarray(pc.equal(lab, "1").to_numpy(zero_copy_only=False))[good]
    else:
        out[LABEL] = np.asarray(pc.cast(lab, pa.float64()).to_numpy(zero_copy_only=False))[good]
    out[LABEL] = np.asarray(out[LABEL], dtype=np.float32)
    for f in schema.dense:
        out[f.name] = _dense_out(dense_vals[f.name][good], f)
    keep = pa.array(good) if not good.all() else None
    with stage_span("hash"):
        for cf in schema.categorical:
            col = table[cf.name] if keep is None else table[cf.name].filter(keep)
            if cf.multi_hot:
                out[cf.name] = _multi_hot(col, cf).array
            else:
                out[cf.name] = hash_column(col, cf.name)
    frame = pd.DataFrame(out)
    report = BadRowReport(counts, {path: int(good.sum())})
    return frame, report


def _fmt(counts: dict[tuple[str, str], int]) -> str:
    return ", ".join(f"{r}={k}" for (_, r), k in sorted(counts.items()))


def _first_problem(
    raw: _Raw,
    schema: Schema,
    path: str,
    reason: np.ndarray,
    dense_bad_cols: list[tuple[str, np.ndarray]],
) -> str:
    """The message for the earliest bad line: file, line, what was wrong."""
    where = "row" if schema.format == "parquet" else "line"
    cands: list[tuple[int, str]] = list(raw.invalid)
    idx = np.flatnonzero(reason != "")
    if len(idx):
        i = int(idx[0])
        line = int(raw.lines[i]) if raw.lines is not None else i + 1
        r = reason[i]
        if r == Reason.WRONG_COLUMN_COUNT:
            what = "blank line"
        elif r == Reason.LABEL_INVALID:
            what = f"label {raw.table[schema.label][i].as_py()!r} is not 0 or 1"
        else:
            col = next(name for name, mask in dense_bad_cols if mask[i])
            what = f"dense column {col} is not a number: {raw.table[col][i].as_py()!r}"
        cands.append((line, what))
    line, what = min(cands)
    return (
        f"{path}: {where} {line}: {what} (bad-row policy is 'fail'; use 'skip' to drop such rows)"
    )


def read_shard(
    path: str, schema: Schema, policy: BadRowPolicy | None = None
) -> tuple[pd.DataFrame, BadRowReport]:
    """Read, validate, transform and hash one file (plain or gzip text, or parquet).

    Empty and unreadable shards and missing columns are shard-level bad input: counted
    under ``skip``, a :class:`DataError` naming the file under ``fail``.
    """
    policy = policy or BadRowPolicy()
    try:
        raw = (
            _read_parquet(path, schema) if schema.format == "parquet" else _read_text(path, schema)
        )
    except (OSError, pa.ArrowException, KeyError, ValueError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "Empty CSV file" in msg or (os.path.exists(path) and os.path.getsize(path) == 0):
            kind, what = Reason.EMPTY_SHARD, "the file is empty"
        elif "not in" in msg.lower() or "no match for" in msg.lower() or isinstance(e, KeyError):
            kind, what = Reason.SCHEMA_MISMATCH, f"columns do not match the schema ({msg})"
        else:
            kind, what = Reason.UNREADABLE_SHARD, f"cannot read the file ({msg})"
        return _shard_problem(path, schema, policy, kind, what, e)
    if raw.table.num_rows == 0 and not raw.invalid:
        return _shard_problem(path, schema, policy, Reason.EMPTY_SHARD, "no rows", None)
    return parse_table(raw, schema, path, policy)


def _shard_problem(
    path: str,
    schema: Schema,
    policy: BadRowPolicy,
    kind: str,
    what: str,
    cause: BaseException | None,
) -> tuple[pd.DataFrame, BadRowReport]:
    if policy.fail:
        raise DataError(f"{path}: {what} (bad-row policy is 'fail')") from cause
    log.warning("skipping shard %s: %s", path, what)
    return empty_frame(schema), BadRowReport({(path, kind): 1}, {path: 0})

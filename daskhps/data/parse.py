"""Parse one click-log shard (a file) into a frame of labels, dense values and int64 keys.

This is the per-partition work of the reader; it knows nothing about Dask. All checks are
vectorised (Arrow compute and numpy); Python only loops over columns.

One shard becomes::

    label  I1 ... I13   C1 ... C26
    f32    f32    f32   i64    i64      <- one row per good input line, in file order

and a :class:`BadRowReport` of what was dropped. A file read without its label column (see
:mod:`daskhps.data.labels`) has a NaN ``label``. :mod:`daskhps.data.rawshard` reads the file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from daskhps.data.badrows import BadRowPolicy, BadRowReport, Reason
from daskhps.data.keyspace import FieldKeys
from daskhps.data.labels import check_label_mode
from daskhps.data.rawshard import (
    RawShard,
    read_raw_parquet,
    read_raw_text,
    text_raw,
    used_columns,
)
from daskhps.data.schema import LABEL, CategoricalField, DenseField, Schema
from daskhps.data.textfile import decode_text
from daskhps.errors import DataError, first_line
from daskhps.stages import stage_span
from daskhps.storage import file_size, transport_failure

__all__ = [
    "as_numbers",
    "empty_frame",
    "parse_columns",
    "parse_table",
    "parse_text",
    "read_shard",
    "transform_dense",
]

log = logging.getLogger(__name__)

_NOT_UTF8 = "not UTF-8 text (a damaged or differently encoded line)"
_NUMBER = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"
KEY_LIST = pd.ArrowDtype(pa.list_(pa.int64()))


def empty_frame(schema: Schema) -> pd.DataFrame:
    """A zero-row frame with the parsed dtypes (Dask's ``meta``)."""
    cols: dict[str, pd.Series] = {LABEL: pd.Series([], dtype="float32")}
    for d in schema.dense:
        cols[d.name] = pd.Series([], dtype="float32")
    for c in schema.categorical:
        cols[c.name] = pd.Series([], dtype=KEY_LIST if c.multi_hot else "int64")
    return pd.DataFrame(cols)


def as_numbers(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
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


def _label_out(raw: RawShard, schema: Schema, good: np.ndarray) -> np.ndarray:
    """float32 labels of the good rows; NaN for a file read without its label column."""
    if not raw.labelled:
        return np.full(int(good.sum()), np.nan, dtype=np.float32)
    lab = raw.table[schema.label]
    if pa.types.is_string(lab.type) or pa.types.is_large_string(lab.type):
        values = pc.equal(lab, "1").to_numpy(zero_copy_only=False)
    else:
        values = pc.cast(lab, pa.float64()).to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.float32)[good]


def transform_dense(values: np.ndarray, f: DenseField) -> np.ndarray:
    missing = np.isnan(values)
    if f.clip_min is not None or f.clip_max is not None:
        values = np.clip(values, f.clip_min, f.clip_max)
    if f.transform == "log1p":
        values = np.log1p(values)
    values[missing] = f.fill
    return values.astype(np.float32)


def _multi_hot(col: pa.ChunkedArray, f: CategoricalField, keying: FieldKeys, i: int) -> pd.Series:
    """Split, hash, and rebuild the lists; an empty or missing cell is ``[missing key]``."""
    assert f.separator is not None
    arr = pc.split_pattern(pc.cast(col, pa.string()), f.separator).combine_chunks()
    arr = pc.fill_null(arr, pa.scalar([], pa.list_(pa.string())))
    tokens = arr.flatten()
    keep = np.asarray(pc.fill_null(pc.not_equal(tokens, ""), False))
    row = np.repeat(np.arange(len(arr)), np.diff(np.asarray(arr.offsets)))[keep]
    keys = keying.hash(tokens.filter(pa.array(keep)), i)
    counts = np.bincount(row, minlength=len(arr))
    empty = counts == 0
    # Rows without tokens get the field's missing key: insert it in row order.
    row = np.concatenate([row, np.flatnonzero(empty)])
    keys = np.concatenate([keys, np.full(int(empty.sum()), keying.missing(i), np.int64)])
    order = np.argsort(row, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.maximum(counts, 1))]).astype(np.int32)
    lists = pa.ListArray.from_arrays(pa.array(offsets), pa.array(keys[order]))
    return pd.Series(pd.arrays.ArrowExtensionArray(lists), name=f.name)


_FIX = " (bad-row policy is 'fail'; use 'skip' to drop such rows)"


def parse_table(
    raw: RawShard,
    schema: Schema,
    path: str,
    policy: BadRowPolicy,
    where: str | None = None,
    fix: str = _FIX,
    warn: bool = True,
) -> tuple[pd.DataFrame, BadRowReport]:
    """Validate, drop or reject bad rows, then transform and hash the good ones. A rejection
    names ``path`` and the ``where`` (line, or row of parquet) of the first bad row, then
    ``fix``. ``warn``: log a truncated file here (else its report's summary names it)."""
    checks = _check_rows(raw, schema)
    counts = _bad_counts(raw, path, checks.reason)
    _apply_policy(raw, schema, path, policy, checks, counts, where, fix, warn)
    good = ~checks.bad
    frame = _good_frame(raw, schema, checks.dense_values, good)
    return frame, BadRowReport(counts, {path: int(good.sum())})


@dataclass
class _RowChecks:
    """What is wrong with each row of a shard's table (``""``: nothing), and the dense values
    parsed on the way."""

    reason: np.ndarray  # object: a Reason per row, "" for a good one
    bad: np.ndarray  # bool per row
    dense_values: dict[str, np.ndarray]  # float64 per dense column, NaN where missing
    dense_bad: list[tuple[str, np.ndarray]]  # (column, rows not a number) where any is not


def _check_rows(raw: RawShard, schema: Schema) -> _RowChecks:
    """Each row's first problem; an earlier check's problem hides a later one's."""
    table = raw.table
    n = table.num_rows
    # A line that was not UTF-8 is dropped whatever else it holds: its fields are garbage.
    undecodable = (
        np.isin(raw.lines, raw.undecodable)
        if len(raw.undecodable) and raw.lines is not None
        else np.zeros(n, dtype=bool)
    )
    blank = _blank_rows(raw, schema, undecodable)
    label_bad = np.zeros(n, dtype=bool)
    if raw.labelled:
        label_bad = ~_label_ok(table[schema.label]) & ~blank & ~undecodable
    dense_vals: dict[str, np.ndarray] = {}
    dense_bad_cols: list[tuple[str, np.ndarray]] = []
    dense_bad = np.zeros(n, dtype=bool)
    for f in schema.dense:
        vals, bad = as_numbers(table[f.name])
        dense_vals[f.name] = vals
        bad &= ~blank & ~label_bad
        if bad.any():
            dense_bad_cols.append((f.name, bad))
        dense_bad |= bad
    reason = np.full(n, "", dtype=object)
    reason[dense_bad] = Reason.DENSE_NOT_NUMERIC
    reason[label_bad] = Reason.LABEL_INVALID
    reason[blank] = Reason.WRONG_COLUMN_COUNT
    reason[undecodable] = Reason.UNDECODABLE
    bad = blank | label_bad | dense_bad | undecodable
    return _RowChecks(reason, bad, dense_vals, dense_bad_cols)


def _blank_rows(raw: RawShard, schema: Schema, undecodable: np.ndarray) -> np.ndarray:
    """Blank lines: one empty field where many were expected (no used column has a value)."""
    present = np.zeros(raw.table.num_rows, dtype=bool)
    for c in used_columns(schema, raw.labelled):
        present |= np.asarray(pc.is_valid(raw.table[c]))
    blank = ~present & ~undecodable
    if raw.blank_lines is not None and raw.lines is not None and blank.any():
        blank &= np.isin(raw.lines, raw.blank_lines)
    return blank


def _bad_counts(raw: RawShard, path: str, reason: np.ndarray) -> dict[tuple[str, str], int]:
    """Bad rows by reason: those the CSV reader rejected, then those the checks found; a
    truncated file counts once."""
    counts: dict[tuple[str, str], int] = {}
    # Rows the CSV reader rejected for their field count: undecodable first, as above.
    dropped = np.array([line for line, _ in raw.invalid], dtype=np.int64)
    dropped_undecodable = int(np.isin(dropped, raw.undecodable).sum()) if len(dropped) else 0
    if dropped_undecodable:
        counts[(path, Reason.UNDECODABLE)] = dropped_undecodable
    if len(dropped) > dropped_undecodable:
        counts[(path, Reason.WRONG_COLUMN_COUNT)] = len(dropped) - dropped_undecodable
    for r in (
        Reason.UNDECODABLE,
        Reason.WRONG_COLUMN_COUNT,
        Reason.LABEL_INVALID,
        Reason.DENSE_NOT_NUMERIC,
    ):
        k = int(np.count_nonzero(reason == r))
        if k:
            counts[(path, r)] = counts.get((path, r), 0) + k
    if raw.truncated is not None:
        counts[(path, Reason.TRUNCATED_FILE)] = 1  # one per file: its tail is unknown
    return counts


def _apply_policy(
    raw: RawShard,
    schema: Schema,
    path: str,
    policy: BadRowPolicy,
    checks: _RowChecks,
    counts: dict[tuple[str, str], int],
    where: str | None,
    fix: str,
    warn: bool,
) -> None:
    """Raise as the bad-row policy says (any bad row, or too many); log a truncated file."""
    n = raw.table.num_rows
    nbad = sum(k for (_, r), k in counts.items() if r != Reason.TRUNCATED_FILE)  # rows
    if (nbad or raw.truncated is not None) and policy.fail:
        problem = _first_problem(raw, schema, path, checks.reason, checks.dense_bad, where)
        raise DataError(problem + fix)
    if raw.truncated is not None and warn:
        log.warning(
            "%s: %s; kept the %d complete lines before it",
            path,
            raw.truncated,
            n + len(raw.invalid),
        )
    total = n + len(raw.invalid)
    if nbad and total and nbad / total > policy.max_fraction:
        raise DataError(
            f"{path}: {nbad} of {total} rows are bad ({_fmt(counts)}), more than "
            f"max_fraction={policy.max_fraction}; is this the right schema?"
        )


def _good_frame(
    raw: RawShard, schema: Schema, dense_values: dict[str, np.ndarray], good: np.ndarray
) -> pd.DataFrame:
    """The good rows: labels, transformed dense values and hashed keys."""
    out: dict[str, object] = {}
    out[LABEL] = _label_out(raw, schema, good)
    for f in schema.dense:
        out[f.name] = transform_dense(dense_values[f.name][good], f)
    keep = pa.array(good) if not good.all() else None
    with stage_span("hash"):
        keying = schema.field_keys
        for i, cf in enumerate(schema.categorical):
            col = raw.table[cf.name] if keep is None else raw.table[cf.name].filter(keep)
            if cf.multi_hot:
                out[cf.name] = _multi_hot(col, cf, keying, i).array
            else:
                out[cf.name] = keying.hash(col, i)
    return pd.DataFrame(out)


def _fmt(counts: dict[tuple[str, str], int]) -> str:
    return ", ".join(f"{r}={k}" for (_, r), k in sorted(counts.items()))


def _first_problem(
    raw: RawShard,
    schema: Schema,
    path: str,
    reason: np.ndarray,
    dense_bad_cols: list[tuple[str, np.ndarray]],
    where: str | None = None,
) -> str:
    """The message for the earliest bad line: file, line, what was wrong."""
    where = where or ("row" if schema.format == "parquet" else "line")
    undecodable = set(raw.undecodable.tolist())
    cands: list[tuple[int, str]] = [c for c in raw.invalid if c[0] not in undecodable]
    cands += [(line, _NOT_UTF8) for line in raw.undecodable[:1].tolist()]
    if raw.truncated is not None:
        last = int(raw.lines[-1]) if raw.lines is not None and len(raw.lines) else 0
        end = max([last, *(line for line, _ in raw.invalid)]) + 1
        cands.append((end, f"{raw.truncated}; the lines before it are complete"))
    idx = np.flatnonzero(reason != "")
    if len(idx):
        i = int(idx[0])
        line = int(raw.lines[i]) if raw.lines is not None else i + 1
        r = reason[i]
        if r == Reason.UNDECODABLE:
            what = _NOT_UTF8
        elif r == Reason.WRONG_COLUMN_COUNT:
            what = "blank line"
        elif r == Reason.LABEL_INVALID:
            what = f"label {raw.table[schema.label][i].as_py()!r} is not 0 or 1"
        else:
            col = next(name for name, mask in dense_bad_cols if mask[i])
            what = f"dense column {col} is not a number: {raw.table[col][i].as_py()!r}"
        cands.append((line, what))
    line, what = min(cands)
    line += raw.lines_before()
    return f"{path}: {where} {line}: {what}"


def parse_text(data: bytes, schema: Schema, source: str, labels: str = "auto") -> pd.DataFrame:
    """Log lines held in memory (a request body) in the schema's own format, parsed and hashed
    exactly as :func:`read_shard` parses a file. Every row must be good: the first bad one is
    a :class:`DataError` naming ``source`` and its line."""
    check_label_mode(labels)
    raw = text_raw(decode_text(pa.py_buffer(data)), schema, labels, schema.header)
    return parse_table(raw, schema, source, BadRowPolicy(action="fail"), fix="")[0]


def parse_columns(table: pa.Table, schema: Schema, source: str) -> pd.DataFrame:
    """Rows given as columns (``schema``'s feature names; strings or numbers, null for a
    missing value, no label), parsed and hashed as :func:`read_shard` parses a file's. Every
    row must be good: the first bad one is a :class:`DataError` naming ``source`` and its row
    (0-based)."""
    n = table.num_rows
    for name in schema.feature_columns:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(n, pa.string()))
    none = np.zeros(0, np.int64)
    raw = RawShard(table, np.arange(n, dtype=np.int64), [], labelled=False, blank_lines=none)
    return parse_table(raw, schema, source, BadRowPolicy(action="fail"), where="row", fix="")[0]


def read_shard(
    path: str,
    schema: Schema,
    policy: BadRowPolicy | None = None,
    labels: str = "present",
    byte_range: tuple[int, int] | None = None,
    warn: bool = True,
) -> tuple[pd.DataFrame, BadRowReport]:
    """Read, validate, transform and hash one file (plain or gzip text, or parquet).

    Empty and unreadable shards and missing columns are shard-level bad input: counted
    under ``skip``, a :class:`DataError` naming the file under ``fail``. A line that is not
    UTF-8 is a bad row (``undecodable``); a ``.gz`` file whose data ends early keeps its
    complete lines and counts once as ``truncated_file``.

    ``labels`` (``present``, ``absent`` or ``auto``, see :mod:`daskhps.data.labels`): whether
    the file has the label column; rows read without one get a NaN ``label``.

    ``byte_range`` ``(start, stop)``: only the lines of a plain text file that start in those
    bytes (:func:`daskhps.data.textfile.read_text_bytes`); messages still give the file's own
    line numbers. A range holding no line is no rows, not an empty shard.

    ``warn``: log a truncated file as it is read; a reader that reads a file more than once
    (a pass re-reads what the planning scan read) says it once with the report's summary.
    """
    policy = policy or BadRowPolicy()
    check_label_mode(labels)
    try:
        raw = (
            read_raw_parquet(path, schema, labels)
            if schema.format == "parquet"
            else read_raw_text(path, schema, labels, byte_range)
        )
    except Exception as e:
        if (gone := transport_failure(path, e)) is not None:
            raise gone from e  # the store failed, not the bytes: no bad row, one line
        if not isinstance(e, (OSError, pa.ArrowException, KeyError, ValueError)):
            raise
        msg = first_line(e)
        if "Empty CSV file" in msg or file_size(path) == 0:
            kind, what = Reason.EMPTY_SHARD, "the file is empty"
        elif "not in" in msg.lower() or "no match for" in msg.lower() or isinstance(e, KeyError):
            kind, what = Reason.SCHEMA_MISMATCH, f"columns do not match the schema ({msg})"
        else:
            kind, what = Reason.UNREADABLE_SHARD, f"cannot read the file ({msg})"
        return _shard_problem(path, schema, policy, kind, what, e)
    if raw.table.num_rows == 0 and not raw.invalid and raw.truncated is None:
        if byte_range is not None and byte_range[0] > 0:
            return empty_frame(schema), BadRowReport({}, {path: 0})
        return _shard_problem(path, schema, policy, Reason.EMPTY_SHARD, "no rows", None)
    return parse_table(raw, schema, path, policy, warn=warn)


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

"""A shard file read as it is: string (or parquet's typed) columns, and what the reader
already rejected (rows of the wrong width, lines that are not UTF-8, a truncated tail).

:mod:`daskhps.data.parse` validates, transforms and hashes what this reads.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from daskhps.data.labels import parquet_has_label, text_has_label
from daskhps.data.schema import Schema
from daskhps.data.textfile import TextBytes, blank_lines, line_start, lines_before, read_text_bytes
from daskhps.storage import is_url, open_input

__all__ = ["RawShard", "read_raw_parquet", "read_raw_text", "text_raw", "used_columns"]


@dataclass
class RawShard:
    """A shard as read: string (or typed) columns plus what the reader already rejected."""

    table: pa.Table
    lines: np.ndarray | None  # line number (text) or row number (parquet) of each table row
    invalid: list[tuple[int, str]]  # (line, what) of rows the reader dropped
    undecodable: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # lines
    truncated: str | None = None  # why the file's data ends early
    labelled: bool = True  # False: the file has no label column (rows get a NaN label)
    # Line numbers of blank lines. None: a row without any value is one (with a label column,
    # a real row has at least its label); without one, a row may legitimately be all missing.
    blank_lines: np.ndarray | None = None
    # A byte range of a file numbers its lines from 1; the lines of the file before it are
    # counted only when a message names a line (reading the file's prefix costs that much).
    lines_before: Callable[[], int] = lambda: 0


def read_raw_text(
    path: str, schema: Schema, labels: str, byte_range: tuple[int, int] | None = None
) -> RawShard:
    header = schema.header and (byte_range is None or byte_range[0] == 0)  # the first block's
    # A later block of a file with a header: the names are the file's first line.
    names = _header_names(path, schema) if schema.header and not header else None
    text = read_text_bytes(path, byte_range)
    raw = text_raw(text, schema, labels, header, names, empty_ok=byte_range is not None)
    if byte_range is not None and byte_range[0] > 0:
        raw.lines_before = functools.partial(_lines_before_range, path, byte_range[0])
    return raw


def text_raw(
    text: TextBytes,
    schema: Schema,
    labels: str,
    header: bool,
    names: list[str] | None = None,
    empty_ok: bool = False,
) -> RawShard:
    invalid: list[tuple[int, str]] = []

    def on_invalid(row: pacsv.InvalidRow) -> str:
        invalid.append(
            (
                int(row.number or 0),
                f"expected {row.expected_columns} columns, got {row.actual_columns}",
            )
        )
        return "skip"

    # Lines that are not UTF-8 come back as ASCII, and listed.
    labelled = text_has_label(text.data, schema, labels)
    used = used_columns(schema, labelled)
    columns = names or [c for c in schema.columns if labelled or c != schema.label]
    read = pacsv.ReadOptions(
        use_threads=False,  # row numbers of invalid rows are only known single-threaded
        column_names=None if header else columns,
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
    if text.data.size == 0 and (text.truncated is not None or empty_ok):
        # Not one complete line before the damage, or a range in which no line starts:
        # nothing for the CSV reader.
        empty = _empty_text_table(used)
        return RawShard(
            empty, np.zeros(0, np.int64), [], truncated=text.truncated, labelled=labelled
        )
    table = pacsv.read_csv(pa.BufferReader(text.data), read, parse, convert)
    first = 2 if header else 1
    total = table.num_rows + len(invalid)
    lines = np.arange(first, first + total, dtype=np.int64)
    if invalid:
        lines = np.delete(lines, np.array([n for n, _ in invalid]) - first)
    blank = None if labelled else blank_lines(text.data)
    return RawShard(table, lines, invalid, text.undecodable, text.truncated, labelled, blank)


def _header_names(path: str, schema: Schema) -> list[str]:
    """The column names on the first line of a text file with a header."""
    with open_input(path) as f:
        first = f.readline().rstrip(b"\r\n").decode("utf-8", "replace")
    if schema.format == "csv":
        return next(csv.reader([first], delimiter=schema.delimiter))
    return first.split(schema.delimiter)


def _lines_before_range(path: str, start: int) -> int:
    return lines_before(path, line_start(path, start))


def used_columns(schema: Schema, labelled: bool) -> tuple[str, ...]:
    return schema.used_columns if labelled else schema.feature_columns


def _empty_text_table(columns: tuple[str, ...]) -> pa.Table:
    return pa.table({c: pa.array([], pa.string()) for c in columns})


def read_raw_parquet(path: str, schema: Schema, labels: str) -> RawShard:
    labelled = parquet_has_label(path, schema, labels)
    columns = list(used_columns(schema, labelled))
    if is_url(path):  # an object: read in ranges through the store's file
        with open_input(path) as f:
            table = pq.read_table(f, columns=columns)
    else:
        table = pq.read_table(path, columns=columns)
    lines = np.arange(1, table.num_rows + 1, dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)
    return RawShard(table, lines, [], labelled=labelled, blank_lines=None if labelled else none)

"""Whether a click-log file holds the label column: always for training, per file for scoring.

Logs to score usually come without the label (Criteo's test set is its training format less
the first column). ``labels`` says what the reader expects:

- ``present``: every file has the label column (training; a file without it fails to parse);
- ``absent``: no file has it (a text file without a header has one column fewer than the
  schema's ``columns``; a header or parquet file's label column, if any, is not read);
- ``auto``: decided per file: by the header names, the parquet columns, or, for text without
  a header, the field count of its first lines (the first line with either the schema's
  number of columns or one fewer decides).

Rows read without a label get a NaN ``label``; the parsed columns are otherwise the same.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from daskhps.data.schema import Schema
from daskhps.errors import ConfigError
from daskhps.storage import is_url, open_input

__all__ = ["LABEL_MODES", "check_label_mode", "parquet_has_label", "text_has_label"]

LABEL_MODES = ("auto", "present", "absent")
_HEAD = 1 << 16  # bytes looked at to decide: many lines of any click log


def check_label_mode(mode: str) -> str:
    if mode not in LABEL_MODES:
        raise ConfigError(f"labels {mode!r}: choose one of {', '.join(LABEL_MODES)}")
    return mode


def text_has_label(data: pa.Buffer, schema: Schema, mode: str) -> bool:
    """Whether the text of a file (its bytes, see :mod:`daskhps.data.textfile`) has the
    schema's label column under ``mode``."""
    if mode != "auto":
        return mode == "present"
    head = data.slice(0, min(_HEAD, data.size)).to_pybytes()
    lines = head.split(b"\n")
    if data.size > _HEAD:
        lines = lines[:-1]  # the last one may be cut short
    delimiter = schema.delimiter.encode()
    if schema.header:
        if not lines:
            return True
        names = [
            f.strip().strip('"')
            for f in lines[0].rstrip(b"\r").decode("utf-8", "replace").split(schema.delimiter)
        ]
        return schema.label in names
    n = len(schema.columns)
    for line in lines:
        k = line.rstrip(b"\r").count(delimiter) + 1
        if k in (n, n - 1):
            return k == n
    return True  # nothing decides: read as labelled, so the rows count as wrong_column_count


def parquet_has_label(path: str, schema: Schema, mode: str) -> bool:
    """Whether a parquet file has the schema's label column under ``mode``."""
    if mode != "auto":
        return mode == "present"
    if is_url(path):
        with open_input(path) as f:
            return schema.label in pq.read_schema(f).names
    return schema.label in pq.read_schema(path).names

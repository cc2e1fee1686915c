"""What an online request holds: rows of one model's schema, from JSON or from log lines.

Two bodies are accepted, both parsed and hashed exactly as training reads its logs::

    application/json            {"rows": [{"I1": 3, "C1": "68fd1e64", "tags": ["a", "b"]}, ...]}
    text/tab-separated-values   log lines in the schema's own format (text/csv for csv logs),
    text/csv                    with or without the label column

In a JSON row a missing field is a missing value; a value is a string or a number (a
categorical number is hashed by its decimal text, as a parquet integer column is); a multi-hot
field is a list, or one string holding the schema's separator. The label may be present; it is
never used. Anything else is a :class:`RequestError` whose message names the row and the field.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pandas as pd
import pyarrow as pa

from daskhps.data.parse import parse_columns, parse_text
from daskhps.data.schema import CategoricalField, Schema
from daskhps.errors import DaskHPSError, DataError
from daskhps.options import closest

__all__ = ["JSON", "TEXT_TYPES", "RequestError", "read_rows"]

JSON = "application/json"
TEXT_TYPES = {"tsv": "text/tab-separated-values", "csv": "text/csv"}


class RequestError(DaskHPSError, ValueError):
    """A request the server cannot score; ``status`` is its HTTP status (4xx)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def read_rows(body: bytes, content_type: str, schema: Schema, max_rows: int) -> pd.DataFrame:
    """The parsed rows of a request body (see the module docstring), at most ``max_rows``."""
    kind = content_type.split(";")[0].strip().lower()
    if kind in ("", JSON):
        frame = _json_rows(body, schema, max_rows)
    elif kind in TEXT_TYPES.values() or kind == "text/plain":
        want = TEXT_TYPES.get(schema.format)
        if schema.format == "parquet" or (kind != "text/plain" and kind != want):
            raise RequestError(
                f"this model reads {schema.format} logs: send its lines as "
                f"{want or JSON + ' rows'}, or JSON rows as {JSON}",
                415,
            )
        frame = _text_rows(body, schema, max_rows)
    else:
        hint = (
            " (curl -d sends this: add -H 'Content-Type: application/json')"
            if kind == "application/x-www-form-urlencoded"
            else ""
        )
        raise RequestError(
            f"unsupported Content-Type {kind!r}: send {JSON} rows or log lines "
            f"({', '.join(TEXT_TYPES.values())}){hint}",
            415,
        )
    return frame


def _text_rows(body: bytes, schema: Schema, max_rows: int) -> pd.DataFrame:
    if not body.strip():
        raise RequestError("empty batch: the body holds no log line")
    n = body.count(b"\n") + (not body.endswith(b"\n"))
    if n > max_rows:
        raise RequestError(f"{n} lines is more than the limit of {max_rows} rows a request", 413)
    try:
        return parse_text(body, schema, "body")
    except DataError as e:
        raise RequestError(str(e)) from None


def _json_rows(body: bytes, schema: Schema, max_rows: int) -> pd.DataFrame:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"the body is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise RequestError('expected a JSON object {"rows": [{field: value, ...}, ...]}')
    extra = sorted(k for k in doc if k != "rows")
    if extra:
        raise RequestError(f"unknown key {extra[0]!r}: the body's one key is 'rows'")
    rows: list[Any] = doc["rows"]
    if not rows:
        raise RequestError("empty batch: 'rows' holds no row")
    if len(rows) > max_rows:
        raise RequestError(
            f"{len(rows)} rows is more than the limit of {max_rows} rows a request", 413
        )
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise RequestError(f"row {i}: expected an object of field: value, got {row!r}")
    known = (*schema.feature_columns, schema.label)
    fields = set().union(*rows)
    unknown = sorted(str(f) for f in fields if f not in known)
    if unknown:
        i = next(i for i, r in enumerate(rows) if unknown[0] in r)
        hint = closest(unknown[0], list(schema.feature_columns))
        did = f"did you mean {hint!r}? " if hint else ""
        raise RequestError(
            f"row {i}: unknown field {unknown[0]!r}; {did}the model's fields are "
            f"{_names(schema.feature_columns)}"
        )
    columns: dict[str, pa.Array] = {}
    for f in schema.dense:
        if f.name in fields:
            columns[f.name] = _column([r.get(f.name) for r in rows], f.name, numeric=True)
    for c in schema.categorical:
        if c.name in fields:
            values = [r.get(c.name) for r in rows]
            columns[c.name] = (
                _multi_hot(values, c) if c.multi_hot else _column(values, c.name, numeric=False)
            )
    try:
        return parse_columns(pa.table(columns), schema, "request")
    except DataError as e:
        raise RequestError(str(e)) from None


def _names(names: Sequence[str]) -> str:
    return ", ".join(names) if len(names) <= 8 else f"{', '.join(names[:8])}, ..."


def _column(values: list[Any], name: str, numeric: bool) -> pa.Array:
    """One field's values as Arrow: numbers stay numbers, strings strings (the parser checks
    and converts both as it does a file's); a mix is written as the text a log would hold."""
    try:
        arr = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        arr = None
    if arr is not None and _usable(arr.type, numeric):
        return arr
    # A mix of numbers and strings (or a wrong type somewhere): row by row, on this path only.
    text: list[str | None] = []
    for i, v in enumerate(values):
        if v is None or isinstance(v, str):
            text.append(v)
        elif isinstance(v, int) and not isinstance(v, bool):
            text.append(str(v))
        elif isinstance(v, float) and numeric:
            text.append(repr(v))
        else:
            allowed = "a number or a string" if numeric else "a string or an integer"
            raise RequestError(
                f"row {i}: field {name!r}: expected {allowed}, got {type(v).__name__} {v!r}"
            )
    return pa.array(text, pa.string())


def _usable(t: pa.DataType, numeric: bool) -> bool:
    if pa.types.is_string(t) or pa.types.is_null(t) or pa.types.is_integer(t):
        return True
    return numeric and pa.types.is_floating(t)


def _multi_hot(values: list[Any], field: CategoricalField) -> pa.Array:
    """A multi-hot field's lists joined with the schema's separator: the text a log holds."""
    sep = field.separator
    assert sep is not None
    out: list[str | None] = []
    for i, v in enumerate(values):
        if v is None or isinstance(v, str):
            out.append(v)
            continue
        if not isinstance(v, list) or not all(
            isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool)) for x in v
        ):
            raise RequestError(
                f"row {i}: field {field.name!r}: expected a list of strings or integers "
                f"(or one string with {sep!r} between the values), got {v!r}"
            )
        tokens = [str(x) for x in v]
        bad = next((t for t in tokens if sep in t), None)
        if bad is not None:
            raise RequestError(
                f"row {i}: field {field.name!r}: value {bad!r} holds the separator {sep!r}"
            )
        out.append(sep.join(tokens))
    return pa.array(out, pa.string())

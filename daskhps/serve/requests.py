"""What an online request holds: rows of one model's schema, from JSON or from log lines.

Two bodies are accepted, both parsed and hashed exactly as training reads its logs::

    application/json            {"rows": [{"I1": 3, "C1": "68fd1e64", "tags": ["a", "b"]}, ...]}
    text/tab-separated-values   log lines in the schema's own format (text/csv for csv logs),
    text/csv                    with or without the label column

In a JSON row a missing field is a missing value; a value is a string or a number (a
categorical number is hashed by its decimal text, as a parquet integer column is); a multi-hot
field is a list, or one string holding the schema's separator. The label may be present; it is
never used. Anything else is a :class:`RequestError` whose message names the row and the field.

:func:`read_rows` gives the parsed rows as a frame, as a log file's; :class:`RowReader` (what
``daskhps serve`` reads with) gives the model's inputs, the same bits, JSON rows of the usual
kinds without a frame.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import torch

from daskhps.data.parse import as_numbers, parse_columns, parse_text, transform_dense
from daskhps.data.schema import CategoricalField, DenseField, Schema
from daskhps.errors import DaskHPSError, DataError
from daskhps.options import closest
from daskhps.serve.inputs import Inputs

__all__ = ["JSON", "TEXT_TYPES", "RequestError", "RowReader", "read_rows"]

JSON = "application/json"
TEXT_TYPES = {"tsv": "text/tab-separated-values", "csv": "text/csv"}


class RequestError(DaskHPSError, ValueError):
    """A request the server cannot score; ``status`` is its HTTP status (4xx)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def read_rows(body: bytes, content_type: str, schema: Schema, max_rows: int) -> pd.DataFrame:
    """The parsed rows of a request body (see the module docstring), at most ``max_rows``."""
    kind = _kind(content_type)
    if kind in ("", JSON):
        rows, fields = _json_doc(body, schema, frozenset(schema.feature_columns), max_rows)
        frame = _json_frame(rows, fields, schema)
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


_NONE = type(None)
_EXACT = 1 << 53  # integers a float64 holds exactly


class RowReader:
    """Request bodies of one schema as the model's :class:`~daskhps.serve.inputs.Inputs`.

    JSON rows of a single-hot schema go one fast way: every dense cell of the request in one
    Arrow array, parsed and transformed as :func:`read_rows` parses a column
    (daskhps.data.parse), and every categorical cell keyed in one pass
    (:meth:`FieldKeys.hash_rows <daskhps.data.keyspace.FieldKeys.hash_rows>`: salted and,
    with several tables, tagged as the run's parser keys them), with no frame in between.
    What it does not take as it is (a mix of value types other than a column-by-column parse
    would read alike, any bad value, a multi-hot schema, log lines) goes the general way,
    :func:`read_rows` then :meth:`Inputs.from_frame <daskhps.serve.inputs.Inputs.from_frame>`,
    which names the row and the field of a bad one. Both give the same inputs, bit for bit.
    """

    def __init__(self, schema: Schema, max_rows: int) -> None:
        self.schema = schema
        self.max_rows = max_rows
        self._features = frozenset(schema.feature_columns)
        self._fast = not any(f.multi_hot for f in schema.categorical)
        self._cats = schema.categorical_names
        self._keys = schema.field_keys  # the run's: salts, and table tags with several tables
        # Dense fields by treatment: the transform is elementwise, one call a treatment.
        groups: dict[tuple[Any, ...], list[int]] = {}
        for j, f in enumerate(schema.dense):
            groups.setdefault((f.clip_min, f.clip_max, f.transform, f.fill), []).append(j)
        order = [j for js in groups.values() for j in js]
        self._dense_names = [schema.dense[j].name for j in order]
        self._groups: list[tuple[DenseField, int, int]] = []
        for js in groups.values():
            lo = len(self._groups) and self._groups[-1][2]
            self._groups.append((schema.dense[js[0]], lo, lo + len(js)))
        identity = order == sorted(order)
        self._schema_order = None if identity else np.argsort(order)

    def read(self, body: bytes, content_type: str) -> Inputs:
        """The inputs of a request body, at most ``max_rows`` rows; a :class:`RequestError`
        for a body that cannot be scored."""
        schema = self.schema
        if _kind(content_type) not in ("", JSON):
            return Inputs.from_frame(read_rows(body, content_type, schema, self.max_rows), schema)
        rows, fields = _json_doc(body, schema, self._features, self.max_rows)
        inputs = self._fast_inputs(rows) if self._fast else None
        if inputs is None:
            inputs = Inputs.from_frame(_json_frame(rows, fields, schema), schema)
        return inputs

    def _fast_inputs(self, rows: list[dict[str, Any]]) -> Inputs | None:
        dense = self._dense(rows)
        if dense is None:
            return None
        cells = [r.get(c) for r in rows for c in self._cats]
        kinds = set(map(type, cells))
        if not kinds <= {str, _NONE}:
            if not kinds <= {str, int, _NONE}:  # bool, float, list: refused the general way
                return None
            cells = [str(v) if type(v) is int else v for v in cells]  # as an int column is
        try:
            keys = self._keys.hash_rows(pa.array(cells, pa.large_string()))
        except (pa.ArrowException, ValueError):  # a string Arrow cannot hold: the general way
            return None
        return Inputs(torch.from_numpy(dense), torch.from_numpy(keys))

    def _dense(self, rows: list[dict[str, Any]]) -> np.ndarray | None:
        """``float32[n, D]`` of the rows' dense cells, or None to go the general way."""
        n = len(rows)
        cells = [r.get(name) for name in self._dense_names for r in rows]
        kinds = set(map(type, cells))
        kinds.discard(_NONE)
        # One type that the column-by-column parse reads alike: strings parsed as numbers,
        # integers cast, floats as they are; an integer among strings or floats only where a
        # float64 holds it exactly (then its text, or its float, is the same number).
        if kinds <= {str}:
            typ = pa.string()
        elif kinds <= {int}:
            typ = pa.int64()
        elif (kinds <= {str, int} or kinds <= {int, float}) and all(
            -_EXACT <= v <= _EXACT for v in cells if type(v) is int
        ):
            typ = pa.float64() if float in kinds else pa.string()
            if str in kinds:
                cells = [str(v) if type(v) is int else v for v in cells]
        else:
            return None
        try:
            values, bad = as_numbers(pa.array(cells, typ))
        except (pa.ArrowException, OverflowError, ValueError, TypeError):
            return None
        if bad.any():
            return None
        if not values.flags.writeable:  # Arrow's own buffer: the fill writes into it
            values = values.copy()
        block = np.empty((len(self._dense_names), n), dtype=np.float32)
        for f, lo, hi in self._groups:
            block[lo:hi] = transform_dense(values[lo * n : hi * n], f).reshape(hi - lo, n)
        if self._schema_order is not None:
            block = block[self._schema_order]
        return block.T.copy(order="C")  # as the trainer's examples hold it (Inputs.from_frame)


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


def _kind(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


# 19 digits in a row may be an integer past 64 bits, which orjson reads as a float (just
# below -2**63) or refuses, where json reads it exactly: such a body goes to json.
_LONG_NUMBER = re.compile(rb"[0-9]{19}")


def _loads(body: bytes) -> Any:
    """The JSON document of a body: orjson's reading (half of json's time at 1024 rows), or
    json's where orjson would read it otherwise or refuses what json reads (NaN, long
    integers, lone surrogates, a UTF-16 body), so every body reads as json reads it."""
    if _LONG_NUMBER.search(body) is None:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return json.loads(body)


def _json_doc(
    body: bytes, schema: Schema, features: frozenset[str], max_rows: int
) -> tuple[list[dict[str, Any]], set[str]]:
    """The rows of a JSON body, each an object of known fields, and the fields they use."""
    try:
        doc = _loads(body)
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
    fields: set[str] = set().union(*rows)
    unknown = sorted(str(f) for f in fields if f not in features and f != schema.label)
    if unknown:
        i = next(i for i, r in enumerate(rows) if unknown[0] in r)
        hint = closest(unknown[0], list(schema.feature_columns))
        did = f"did you mean {hint!r}? " if hint else ""
        raise RequestError(
            f"row {i}: unknown field {unknown[0]!r}; {did}the model's fields are "
            f"{_names(schema.feature_columns)}"
        )
    return rows, fields


def _json_frame(rows: list[dict[str, Any]], fields: set[str], schema: Schema) -> pd.DataFrame:
    """JSON rows parsed and hashed as the log lines holding the same values."""
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

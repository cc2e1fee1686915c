"""Rows held in memory (a request body, JSON columns) parse and hash exactly as a file does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from daskhps.data.parse import parse_columns, parse_text, read_shard
from daskhps.data.schema import Schema, criteo_schema
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.errors import DataError


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("logs")
    generate(GeneratorConfig(days=1, rows_per_day=500, parts_per_day=1, seed=3), str(out))
    return next(out.glob("day=*/part-*"))


def test_text_in_memory_equals_the_file(log_file: Path) -> None:
    schema = criteo_schema()
    want, _ = read_shard(str(log_file), schema)
    text = log_file.read_bytes()
    if log_file.suffix == ".gz":
        import gzip

        text = gzip.decompress(text)
    pd.testing.assert_frame_equal(parse_text(text, schema, "body"), want)
    unlabelled = b"".join(line.split(b"\t", 1)[1] + b"\n" for line in text.splitlines())
    got = parse_text(unlabelled, schema, "body")
    assert got["label"].isna().all()
    pd.testing.assert_frame_equal(got.drop(columns="label"), want.drop(columns="label"))


def test_columns_equal_the_file(log_file: Path) -> None:
    schema = criteo_schema()
    want, _ = read_shard(str(log_file), schema)
    raw = pd.read_csv(log_file, sep="\t", header=None, names=list(schema.columns), dtype=str)
    columns = {
        c: pa.array([v if isinstance(v, str) else None for v in raw[c]], pa.string())
        for c in schema.feature_columns
    }
    # integers where the log has digits: the same keys and values
    columns["I1"] = pa.array([None if v is None else int(v) for v in columns["I1"].to_pylist()])
    got = parse_columns(pa.table(columns), schema, "request")
    pd.testing.assert_frame_equal(got.drop(columns="label"), want.drop(columns="label"))


def test_a_bad_row_names_its_row_or_line_without_a_policy_hint() -> None:
    schema = Schema.from_dict(
        {"name": "t", "header": True, "label": "y", "dense": ["a"], "categorical": ["b"]}
    )
    with pytest.raises(DataError, match=r"^request: row 1: dense column a is not a number: 'x'$"):
        parse_columns(pa.table({"a": ["1", "x"], "b": ["p", "q"]}), schema, "request")
    with pytest.raises(DataError, match=r"^body: line 3: dense column a is not a number: 'x'$"):
        parse_text(b"y\ta\tb\n1\t2\tp\n0\tx\tq\n", schema, "body")
    empty = parse_columns(pa.table({"a": pa.nulls(2, pa.string())}), schema, "request")
    assert len(empty) == 2 and np.all(empty["a"] == 0.0)  # all missing is a row, not blank

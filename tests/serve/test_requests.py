"""An online request's body as parsed rows: JSON rows give the keys and values the log lines
give, and every bad body is a RequestError naming the row and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from daskhps.data.schema import Schema, load_schema
from daskhps.serve.metrics import batch_label
from daskhps.serve.requests import RequestError, read_rows

ADS = load_schema(Path(__file__).parents[2] / "configs" / "schemas" / "ads_multi_hot.yaml")
TSV = Schema.from_dict(
    {
        "name": "t",
        "header": False,
        "columns": ["y", "price", "ad", "tags"],
        "label": "y",
        "dense": ["price"],
        "categorical": ["ad", {"name": "tags", "separator": "|"}],
    }
)


def _json(rows: list[dict]) -> bytes:
    return json.dumps({"rows": rows}).encode()


def test_json_rows_equal_log_lines() -> None:
    text = b"1\t3.5\tx7\ta|b\n0\t\t12\t\n1\t0\t\tc\n"
    want = read_rows(text, "text/tab-separated-values", TSV, 100)
    rows = [{"price": 3.5, "ad": "x7", "tags": ["a", "b"]}, {"ad": 12}, {"price": "0", "tags": "c"}]
    got = read_rows(_json(rows), "application/json", TSV, 100)
    pd.testing.assert_frame_equal(got.drop(columns="label"), want.drop(columns="label"))
    assert want["label"].tolist() == [1.0, 0.0, 1.0] and got["label"].isna().all()
    # the label may come along; it is never used
    with_label = read_rows(_json([{**r, "y": 1} for r in rows]), "application/json", TSV, 100)
    pd.testing.assert_frame_equal(with_label, got)


def test_a_parquet_models_rows_come_as_json() -> None:
    got = read_rows(_json([{"price": 2, "ad_id": 5, "interests": [1, "x"]}]), "", ADS, 10)
    assert len(got) == 1 and len(got["interests"][0]) == 2
    with pytest.raises(RequestError, match="this model reads parquet logs") as e:
        read_rows(b"1,2\n", "text/csv", ADS, 10)
    assert e.value.status == 415


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ([{"tags": ["a|b"]}], "row 0: field 'tags': value 'a|b' holds the separator '|'"),
        ([{"tags": "a"}, {"tags": [["a"]]}], "row 1: field 'tags': expected a list of strings"),
        ([{"ad": True}], "row 0: field 'ad': expected a string or an integer, got bool True"),
        ([{"price": {"a": 1}}], "row 0: field 'price': expected a number or a string"),
        ([{"prise": 1}], "row 0: unknown field 'prise'; did you mean 'price'?"),
        ([{"price": float("nan")}], "request: row 0: dense column price is not a number"),
    ],
)
def test_bad_rows_name_the_row_and_the_field(rows: list[dict], words: str) -> None:
    with pytest.raises(RequestError) as e:
        read_rows(_json(rows), "application/json", TSV, 100)
    assert words in str(e.value) and e.value.status == 400


def test_limits() -> None:
    with pytest.raises(RequestError, match="3 rows is more than the limit of 2") as e:
        read_rows(_json([{}, {}, {}]), "application/json", TSV, 2)
    assert e.value.status == 413
    with pytest.raises(RequestError, match="3 lines is more than the limit of 2"):
        read_rows(b"1\t2\ta\tb\n" * 3, "text/tab-separated-values", TSV, 2)
    with pytest.raises(RequestError, match="empty batch"):
        read_rows(b"\n", "text/plain", TSV, 2)


def test_batch_buckets() -> None:
    assert [batch_label(n) for n in (1, 2, 64, 65, 1024, 16384, 16385)] == [
        "1", "64", "64", "1024", "1024", "16384", "more",
    ]  # fmt: skip

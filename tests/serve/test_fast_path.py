"""The server's fast ways give the bits of the general ones: JSON rows read in one pass over
the cells (RowReader) against the column-by-column parse (read_rows), and a scorer's batches
against the trainer's batch path (WorkerExamples, Exchange, batch_forward) that ``predict``
and ``serve`` scored with before."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from daskhps.data.schema import Schema
from daskhps.distributed import Exchange
from daskhps.serve.inputs import Inputs
from daskhps.serve.requests import RowReader, _loads, read_rows
from daskhps.serve.score import CacheSizes, Scorer
from daskhps.sharding import ShardMap
from daskhps.training.examples import RANK, WorkerExamples
from daskhps.training.model_input import bag_pooling, batch_forward

SCHEMA = Schema.from_dict(
    {
        "name": "t",
        "columns": ["y", "a", "b", "c", "ad", "user"],
        "label": "y",
        "dense": [
            "a",
            {"name": "b", "transform": "identity", "clip_min": None, "fill": -1.5},
            "c",
        ],  # two treatments, not in field order
        "categorical": ["ad", "user"],
    }
)
JSON = "application/json"


def _body(rows: list[dict[str, Any]]) -> bytes:
    return json.dumps({"rows": rows}).encode()


def _general(body: bytes, schema: Schema) -> Inputs:
    return Inputs.from_frame(read_rows(body, JSON, schema, 1000), schema)


def _same(a: Inputs, b: Inputs) -> None:
    for x, y in ((a.dense, b.dense), (a.keys, b.keys)):
        assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
        assert np.array_equal(x.numpy().view(np.uint8), y.numpy().view(np.uint8))
    assert a.offsets is None and b.offsets is None


DENSE = st.one_of(
    st.none(),
    st.integers(-(2**60), 2**60),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["3", "-7", "0", "1e3", " 4", "2.5", "", "x", "nan", "12345678901234567"]),
    st.booleans(),
)
CATEGORICAL = st.one_of(
    st.none(),
    st.text(max_size=12),
    st.integers(-(2**70), 2**70),
    st.sampled_from(["68fd1e64", "", "é", "a\tb"]),
    st.floats(allow_nan=False),
    st.booleans(),
)
ROW = st.fixed_dictionaries(
    {},
    optional={
        **{f: DENSE for f in ("a", "b", "c")},
        **{f: CATEGORICAL for f in ("ad", "user")},
        "y": st.integers(0, 1),
    },
)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e300
@settings(max_examples=100, deadline=None)
@given(st.lists(ROW, min_size=1, max_size=6), st.sampled_from(["dense", "keys", "both"]))
def test_json_rows_read_in_one_pass_as_column_by_column(rows: list[dict], plain: str) -> None:
    """Any JSON rows: the same inputs bit for bit, or the same one-line refusal."""
    if plain in ("dense", "both"):  # also the common, fast-path shapes of a request
        rows = [{**r, "a": str(i * 37 % 1000), "c": str(i)} for i, r in enumerate(rows)]
    if plain in ("keys", "both"):
        rows = [{**r, "ad": f"{i:08x}", "user": i - 3} for i, r in enumerate(rows)]
    body = _body(rows)
    try:
        want: Inputs | str = _general(body, SCHEMA)
    except Exception as e:  # whatever the general way raises, a RequestError or not
        want = f"{type(e).__name__}: {e}"
    try:
        got: Inputs | str = RowReader(SCHEMA, 1000).read(body, JSON)
    except Exception as e:
        got = f"{type(e).__name__}: {e}"
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
    else:
        _same(got, want)


def test_the_fast_way_is_taken_and_a_mix_goes_the_general_way() -> None:
    reader = RowReader(SCHEMA, 1000)
    rows = [{"a": "3", "b": "-2", "ad": "x", "user": 7}, {}, {"c": None, "ad": ""}]
    assert reader._fast_inputs(rows) is not None
    _same(reader.read(_body(rows), JSON), _general(_body(rows), SCHEMA))
    assert reader._fast_inputs([{"a": 3, "b": 2, "c": 2.0**40}, {"a": 2.5}]) is not None
    for other in ({"a": 2.5, "b": "2"}, {"a": True}, {"a": 2**60, "b": "1"}, {"ad": 1.0}):
        assert reader._fast_inputs([other]) is None, other


def _trainer_scores(
    model: torch.nn.Module, schema: Schema, lookup: Any, frame: pd.DataFrame, batch_size: int
) -> np.ndarray:
    """How ``predict`` and ``serve`` scored a frame before: the trainer's batch path as one
    rank (WorkerExamples cut by rank, Exchange.route, batch_forward)."""
    n = len(frame)
    nb = -(-n // batch_size)
    data = WorkerExamples.from_frame(
        frame.assign(**{RANK: np.arange(n, dtype=np.int64)}), schema, batch_size, nb
    )
    exchange = Exchange(None, ShardMap(8, 1))
    out = np.empty(n, dtype=np.float32)
    with torch.no_grad():
        for b in range(nb):
            dense, keys, offsets, _ = data.batch(b)
            logits, _, _ = batch_forward(
                model, exchange, lookup, dense, keys, offsets, bag_pooling(schema)
            )
            lo = int(data.starts[b])
            out[lo : lo + len(logits)] = torch.sigmoid(logits).numpy()
    return out


@pytest.mark.parametrize("batch_size", [7, 4096])
def test_a_request_scores_as_the_trainers_batch_path(run: dict[str, Any], batch_size: int) -> None:
    """The served model's scores of JSON rows (the fast way), of their frame (``predict``'s
    way) and of the trainer's batch path over the same lookup: the same bits, batches cut
    in several or not, with a device cache smaller than a batch."""
    servable = run["servable"]
    schema = servable.config.data.schema
    raw = pd.read_csv(run["holdout"][0], sep="\t", header=None, names=list(schema.columns),
                      dtype=str, keep_default_na=False).head(40)  # fmt: skip
    rows = [{k: v for k, v in r.items() if v and k != schema.label}
            for r in raw.to_dict("records")]  # fmt: skip
    rows[3] = {**rows[3], "I1": 5, "C1": 12}  # numbers where the log holds digits
    body = _body(rows)
    reader = RowReader(schema, 1000)
    assert reader._fast_inputs(json.loads(body)["rows"]) is not None
    frame = read_rows(body, JSON, schema, 1000)
    scorer = Scorer(servable, CacheSizes(device_rows=300, host_bytes=1 << 14), batch_size)
    try:
        fast = scorer.score_inputs(reader.read(body, JSON))
        framed = scorer.score(frame)
        want = _trainer_scores(scorer.model, schema, scorer._lookup, frame, batch_size)
    finally:
        scorer.close()
    assert fast.dtype == np.float32 and len(fast) == len(rows)
    assert np.array_equal(fast.view(np.int32), want.view(np.int32))
    assert np.array_equal(framed.view(np.int32), want.view(np.int32))


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)  # past 64 bits: orjson refuses, json reads
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(value=_JSON_VALUES, ensure_ascii=st.booleans())
@example(value=-(2**63) - 1, ensure_ascii=True)  # orjson reads it as a float
@example(value=[2**64, float("nan"), "\ud800"], ensure_ascii=True)  # orjson refuses these
def test_a_body_reads_as_json_reads_it(value: Any, ensure_ascii: bool) -> None:
    """orjson reads a body first; whatever it refuses json reads, so every body gives json's
    document (NaN compares by its text)."""
    body = json.dumps(value, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")
    try:
        want = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        with pytest.raises((ValueError, UnicodeDecodeError)):
            _loads(body)
        return
    assert json.dumps(_loads(body)) == json.dumps(want)

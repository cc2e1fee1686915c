"""Scoring parsed rows through the serving lookup, without a cluster: single- and multi-hot
schemas against a naive per-example reference over the stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from daskhps.data.hashing import missing_key
from daskhps.data.schema import LABEL, Schema
from daskhps.models import build_model
from daskhps.serve import ServingLookup
from daskhps.serve.score import predict_frame
from daskhps.table import OptimizerSpec, TableSpec
from tests.serve.helpers import reference_rows, train_commit, version

SPEC = TableSpec("emb", 4, OptimizerSpec(kind="sgd", lr=0.5), seed=3)


def _schema() -> Schema:
    return Schema.from_dict(
        {
            "name": "mh",
            "format": "parquet",
            "label": "clicked",
            "dense": ["x"],
            "categorical": [
                "ad",
                {"name": "tags", "separator": "|", "pooling": "mean"},
                "user",
                {"name": "more", "separator": ",", "pooling": "sum"},
            ],
        }
    )


def _frame() -> pd.DataFrame:
    """Seven rows with empty and missing multi-hot cells and a repeated key in one bag."""
    cells: dict[str, list[Any]] = {
        "tags": [[1, 2, 3], [], None, [4], [5, 5], [6], [1]],
        "more": [[7], [8, 9], [10, 11, 12], None, [], [13], [99]],
    }
    df = pd.DataFrame(
        {
            LABEL: np.array([1, 0, 0, 1, 1, 0, 1], np.float32),
            "x": np.linspace(-1, 1, 7).astype(np.float32),
            "ad": np.arange(100, 107, dtype=np.int64),
            "tags": pd.Series(pd.arrays.ArrowExtensionArray(pa.array(cells["tags"]))),
            "user": np.array([200, 201, 202, 203, 204, 205, 777], dtype=np.int64),
            "more": pd.Series(pd.arrays.ArrowExtensionArray(pa.array(cells["more"]))),
        }
    )
    return df


def _naive(model: torch.nn.Module, schema: Schema, df: pd.DataFrame, v: Any) -> np.ndarray:
    """Each bag's rows read with the table's own peek, pooled one example at a time."""
    sparse = torch.zeros(len(df), len(schema.categorical), SPEC.dim)
    for i in range(len(df)):
        for j, f in enumerate(schema.categorical):
            cell = df[f.name].iloc[i]
            if not f.multi_hot:
                keys = [int(cell)]
            elif cell is None or cell is pd.NA or len(cell) == 0:
                keys = [missing_key(f.name)]
            else:
                keys = [int(k) for k in cell]
            rows = reference_rows(v, torch.tensor(keys, dtype=torch.int64))[:, : SPEC.dim]
            sparse[i, j] = rows.mean(0) if f.multi_hot and f.pooling == "mean" else rows.sum(0)
    dense = torch.from_numpy(df[["x"]].to_numpy(np.float32).copy())
    with torch.no_grad():
        return torch.sigmoid(model(dense, sparse)).numpy()


@pytest.mark.parametrize("batch_size", [3, 100])
def test_multi_hot_rows_score_as_pooled_by_hand(tmp_path: Path, batch_size: int) -> None:
    schema = _schema()
    written = torch.tensor([1, 2, 4, 7, 9, 100, 103, 200, 205], dtype=torch.int64)
    train_commit(tmp_path, written, "v1", spec=SPEC)  # the rest are unseen: initial rows
    v = version(tmp_path, "v1", spec=SPEC)
    torch.manual_seed(0)
    model = build_model("dlrm", num_dense=1, num_fields=4, embedding_dim=SPEC.dim).eval()
    df = _frame()
    with ServingLookup(v, device_rows=5, host_bytes=2048) as lk:  # smaller than one batch
        got = predict_frame(
            model,
            schema,
            lambda keys: lk.lookup(keys, unique=True),
            df,
            num_shards=8,
            batch_size=batch_size,
        )
    assert got.shape == (len(df),) and got.dtype == np.float32
    assert np.abs(got - _naive(model, schema, df, v)).max() < 1e-6


def test_an_empty_frame_scores_to_nothing(tmp_path: Path) -> None:
    train_commit(tmp_path, torch.arange(3), "v1", spec=SPEC)
    model = build_model("dlrm", num_dense=1, num_fields=4, embedding_dim=SPEC.dim)
    with ServingLookup(version(tmp_path, "v1", spec=SPEC), device_rows=5) as lk:
        got = predict_frame(model, _schema(), lk.lookup, _frame().iloc[:0], num_shards=8)
    assert got.shape == (0,)

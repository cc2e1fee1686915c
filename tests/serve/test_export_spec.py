"""export.json's feature, key-hash and initialisation sections are complete: an implementation
written from them alone (tests/serve/standalone.py, no daskhps import) reproduces daskhps's
keys, dense values and initial rows from raw log lines. No training run: the sections come
from the functions export_model writes them with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from daskhps.data.describe import features
from daskhps.data.hashing import hash_spec
from daskhps.data.parse import read_shard
from daskhps.data.schema import DenseField, Schema, criteo_schema
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.table.init import init_embedding, init_spec
from tests.serve.standalone import Hps64, Inputs, dense_value, initial_rows


@pytest.fixture(scope="module")
def part(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("spec-logs")
    generate(GeneratorConfig(days=1, rows_per_day=400, parts_per_day=1, vocab_scale=0.01), out)
    (path,) = out.glob("day=*/part-*")
    return path


def _meta(schema: Schema) -> dict:
    return {
        "features": features(schema),
        "key_hash": hash_spec(),
        "inputs": {
            "dense": {"columns": list(schema.dense_names)},
            "sparse": {"fields": list(schema.categorical_names)},
        },
    }


def test_raw_rows_give_daskhps_keys_and_dense_values(part: Path) -> None:
    schema = criteo_schema()
    frame, _ = read_shard(str(part), schema)
    inputs = Inputs(_meta(schema))
    rows = inputs.cells(part.read_text().splitlines())
    assert any(r["C3"] is None for r in rows) and any(r["I1"] is None for r in rows)  # missing
    keys = inputs.keys(rows)
    assert np.array_equal(keys, frame[list(schema.categorical_names)].to_numpy(np.int64))
    dense = inputs.dense(rows)
    want = frame[list(schema.dense_names)].to_numpy(np.float32)
    assert np.array_equal(dense.view(np.int32), want.view(np.int32))


def test_every_dense_option_is_described() -> None:
    from daskhps.data.parse import transform_dense

    fields = [
        DenseField(name="a"),
        DenseField(name="b", transform="identity", clip_min=None, clip_max=3.0, fill=-1.0),
        DenseField(name="c", transform="log1p", clip_min=2.0, clip_max=10.0, fill=0.5),
    ]
    cells = ["-4", "0", "2.5", "7", "1e3", None]
    spec = features(Schema(name="s", label="y", header=True, dense=tuple(fields)))["dense"]
    for f, described in zip(fields, spec, strict=True):
        values = np.array([np.nan if c is None else float(c) for c in cells])
        want = transform_dense(values, f)
        got = np.array([dense_value(c, described) for c in cells], dtype=np.float32)
        assert np.array_equal(got.view(np.int32), want.view(np.int32)), f.name


@pytest.mark.parametrize(
    ("seed", "dim", "scale"), [(0, 4, 0.5), (7, 5, 0.25), (2**40 + 3, 16, 0.1)]
)
def test_unseen_keys_get_the_initial_rows(seed: int, dim: int, scale: float) -> None:
    keys = np.array([0, 1, 12345, 2**62 + 17, 2**63 - 1], dtype=np.int64)
    want = init_embedding(torch.from_numpy(keys), seed=seed, dim=dim, scale=scale).numpy()
    got = initial_rows(keys, init_spec(seed, dim, scale))
    assert np.array_equal(got.view(np.int32), want.view(np.int32))


def test_salts_and_missing_keys_match_the_hash() -> None:
    meta = _meta(criteo_schema())
    h = Hps64(meta["key_hash"])
    for f in meta["features"]["categorical"]:
        assert int(f["salt"], 16) == h.salt(f["name"])
        assert int(f["missing_key"], 16) == h.key(f["name"], None)

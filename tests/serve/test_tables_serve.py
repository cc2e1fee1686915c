"""Serving a run with several embedding tables: one small 3-table run (a table of dim 8 with
admission, one of dim 2 with shared keys, the default table of dim 4: flat model input),
trained once on the session's shared cluster, then predicted, served online, exported and
followed through a publish.

The reference is computed without the serving code: the dense model from the checkpoint and
each field's rows read with ``EmbeddingTable.peek`` from its table's rank stores, laid out
field after field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from daskhps.config import RunConfig
from daskhps.data.keyspace import TABLE_SHIFT
from daskhps.data.readers import read_click_log
from daskhps.distributed import start_cluster
from daskhps.errors import DataError
from daskhps.retrain.versions import Attempt, Registry, Version
from daskhps.runfiles.checkpoint import Checkpoint, list_checkpoints
from daskhps.serve import Servable, load_servable
from daskhps.serve.export import META, export_model
from daskhps.serve.inputs import Inputs
from daskhps.serve.predict import predict
from daskhps.serve.requests import JSON, RowReader, read_rows
from daskhps.serve.score import CacheSizes
from daskhps.serve.server import ServeOptions
from daskhps.serve.tables import TablesLookup
from daskhps.training.metrics import evaluate_predictions
from daskhps.training.trainer import Trainer
from tests._clusters import SharedClusters
from tests._logs import generated_logs
from tests._runs import tiny_config
from tests.serve import standalone
from tests.serve.helpers import Running, reference_rows

pytestmark = pytest.mark.slow

TABLES = [
    {"name": "ids", "dim": 8, "features": ["C1", "C2", "C3"], "admission": {"min_count": 2}},
    {"name": "small", "dim": 2, "features": ["C{4..6}"], "shared_keys": True},
]


def _reference(s: Servable, frame: pd.DataFrame) -> np.ndarray:
    """Click probabilities of ``frame``'s rows from rows read straight from the stores."""
    cfg = s.config
    schema = cfg.data.schema
    keys = frame[list(schema.categorical_names)].to_numpy(np.int64)
    parts = []
    for f, t in enumerate(cfg.field_tables()):
        v = s.tables[t]
        assert (keys[:, f] >> TABLE_SHIFT == t).all()  # the parser tagged the field's keys
        parts.append(reference_rows(v, torch.from_numpy(keys[:, f].copy()))[:, : v.spec.dim])
    dense = torch.from_numpy(frame[list(schema.dense_names)].to_numpy(np.float32).copy())
    with torch.no_grad():
        return torch.sigmoid(s.build_model()(dense, torch.cat(parts, dim=1))).numpy()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, shared_clusters: SharedClusters) -> Any:
    logs = generated_logs(tmp_path_factory, days=2, rows_per_day=1000, parts_per_day=1, seed=5)
    tmp = tmp_path_factory.mktemp("tables-serve")
    d = tiny_config(
        tmp / "run",
        logs,
        data={"holdout": {"day": "last"}},
        passes={"examples_per_pass": 500},
        tables=TABLES,
        checkpoint={"every_passes": 1},
        cluster_section=shared_clusters.section(workers=2, threads=1),
    )
    cfg = RunConfig.from_dict(d, source="test")
    result = Trainer(cfg, progress=False).run()  # a checkpoint after each of its 2 passes
    ckpts = list_checkpoints(cfg.run.dir)
    holdout = sorted(str(p) for p in logs.glob("day=*02/part-*"))
    frame = read_click_log(holdout, schema=cfg.data.schema).frame.compute()
    frame = frame.reset_index(drop=True)
    servables = [Servable.from_checkpoint(c) for c in ckpts]
    return {
        "cfg": cfg,
        "result": result,
        "ckpts": ckpts,
        "servables": servables,
        "holdout": holdout,
        "frame": frame,
        "reference": [_reference(s, frame) for s in servables],
        "tmp": tmp,
    }


@pytest.fixture(scope="module")
def client(shared_clusters: SharedClusters) -> Iterator[Any]:
    with start_cluster(address=shared_clusters.address(workers=2, threads=1)) as handle:
        yield handle.client


def test_a_checkpoint_of_several_tables_is_a_servable_of_each(run: Any) -> None:
    s = load_servable(run["cfg"].run.dir)
    assert len(run["ckpts"]) == 2 and s.name == run["ckpts"][-1].name
    assert [v.spec.name for v in s.tables] == ["ids", "small", "embeddings"]
    assert [v.spec.dim for v in s.tables] == [8, 2, 4]
    assert {v.commit for v in s.tables} == {run["ckpts"][-1].commit}
    assert s.table == s.tables[0] and s.several_tables
    # one lookup of every table's keys: each row from its table, zeros beyond its width
    keys = run["frame"][list(s.config.data.schema.categorical_names)].to_numpy(np.int64)
    keys = torch.from_numpy(np.concatenate([keys[:20, 0], keys[:20, 4], keys[:20, 9]]))
    with TablesLookup(s.tables, device_rows=30, host_bytes=1 << 10, fields=[3, 3, 20]) as lk:
        rows = lk.lookup(keys)
        assert rows.shape == (60, 8)
        for i, v in enumerate(s.tables):
            got = rows[20 * i : 20 * (i + 1)]
            want = reference_rows(v, keys[20 * i : 20 * (i + 1)])[:, : v.spec.dim]
            assert torch.equal(got[:, : v.spec.dim], want) and not got[:, v.spec.dim :].any()
        with pytest.raises(DataError, match=r"names table 5, but the model has 3 tables"):
            lk.lookup(torch.tensor([5 << TABLE_SHIFT]))


def test_predict_equals_the_trainers_evaluation(run: Any, client: Any) -> None:
    s, frame = run["servables"][-1], run["frame"]
    out = run["tmp"] / "pred"
    res = predict(
        s,
        run["holdout"],
        out,
        client=client,
        sizes=CacheSizes(device_rows=300, host_bytes=16 << 10),  # tiny: every tier is used
        batch_size=256,
    )
    prob = pd.read_parquet(out)["probability"].to_numpy()
    assert res.rows == len(frame) == len(prob)
    assert np.abs(prob - run["reference"][-1]).max() < 1e-6
    mine = evaluate_predictions(prob, frame["label"].to_numpy(), ("auc", "logloss"))
    final = run["result"].final_eval
    assert mine["examples"] == final["examples"]
    assert abs(mine["logloss"] - final["logloss"]) < 1e-6
    assert abs(mine["auc"] - final["auc"]) < 1e-6
    assert res.lookup["store"] > 0 and res.lookup["init"] > 0  # unadmitted ids keys: init


def test_request_keys_are_the_runs_keys_both_ways(run: Any) -> None:
    """JSON rows take the fast way (one hash pass, salted and tagged per field) and give the
    keys the column-by-column parse gives."""
    schema = run["cfg"].data.schema
    lines = Path(run["holdout"][0]).read_text().splitlines()[:50]
    body = json.dumps({"rows": _json_rows(schema, lines)}).encode()
    fast = RowReader(schema, 100).read(body, JSON)
    slow = Inputs.from_frame(read_rows(body, JSON, schema, 100), schema)
    assert np.array_equal(fast.keys.numpy(), slow.keys.numpy())
    assert np.array_equal(fast.keys.numpy(), run["frame"][list(schema.categorical_names)][:50])


def _json_rows(schema: Any, lines: list[str]) -> list[dict[str, str]]:
    cols = schema.columns
    return [
        {c: v for c, v in zip(cols, line.split("\t"), strict=True) if v != "" and c != "label"}
        for line in lines
    ]


def _publish(registry: Registry, name: str, ckpt: Checkpoint) -> None:
    """Make ``ckpt`` (as it is, no frozen copy) the registry's current version ``name``."""
    days = ("2024-01-01",)
    registry.publish(
        Version(name, str(ckpt.path), ckpt.commit, str(ckpt.stores_dir), None, days,
                days[0], "2024-01-02"),
        Attempt(f"a-{name}", None, days, "2024-01-02", "published", name),
    )  # fmt: skip


def test_the_server_answers_as_predict_and_follows_a_publish(run: Any) -> None:
    schema, ref = run["cfg"].data.schema, run["reference"]
    lines = Path(run["holdout"][0]).read_text().splitlines()[:64]
    rows = _json_rows(schema, lines)
    registry = Registry(run["tmp"] / "retrain" / "versions")
    _publish(registry, "v000001", run["ckpts"][0])
    server = Running(
        ServeOptions(model=str(registry.folder.parent), device_rows=200, host_bytes=8 << 10)
    )
    try:
        first = server.client.predict(rows)
        assert first.version == "v000001"
        assert np.abs(np.array(first.probabilities) - ref[0][:64]).max() < 1e-6
        text = server.client.predict_lines("\n".join(lines))  # the column-by-column way
        assert np.abs(np.array(text.probabilities) - ref[0][:64]).max() < 1e-6
        _publish(registry, "v000002", run["ckpts"][1])
        swap = server.refresh()
        assert swap.new == "v000002" and swap.how in ("replay", "diff"), swap
        online = server.server.online
        assert online is not None and isinstance(online.scorer.lookup, TablesLookup)
        want = run["ckpts"][1].commit
        assert [v.commit for v in online.scorer.lookup.versions] == [want] * 3
        second = server.client.predict(rows)
        assert second.version == "v000002"
        assert np.abs(np.array(second.probabilities) - ref[1][:64]).max() < 1e-6
        assert np.abs(np.array(second.probabilities) - ref[0][:64]).max() > 1e-6  # it moved
    finally:
        server.close()


def test_export_writes_a_dump_per_table_and_the_feature_map(run: Any) -> None:
    """A serving stack written from export.json alone (tests/serve/standalone.py) keys raw
    lines as the run does, reads each field's rows from its table's dump, and the TorchScript
    model gives daskhps's predictions."""
    s, frame = run["servables"][-1], run["frame"]
    out = run["tmp"] / "export"
    res = export_model(s, out)
    meta = json.loads((out / META).read_text())
    assert res.tables == 3 and res.sparse_dim == 8
    assert [t["name"] for t in meta["tables"]] == ["ids", "small", "embeddings"]
    assert meta["feature_tables"]["C1"] == {
        "table": "ids",
        "index": 0,
        "dim": 8,
        "shared_keys": False,
    }
    assert meta["feature_tables"]["C5"]["shared_keys"] and meta["feature_tables"]["C9"]["dim"] == 4
    assert meta["inputs"]["sparse"]["shape"] == ["B", 3 * 8 + 3 * 2 + 20 * 4]
    for i, t in enumerate(meta["tables"]):
        keys = np.load(out / t["files"]["keys"])
        rows = np.load(out / t["files"]["embeddings"])
        assert len(keys) == t["keys"] > 0 and rows.shape == (len(keys), t["dim"])
        assert (keys >> TABLE_SHIFT == i).all()
    assert meta["keys"] == sum(t["keys"] for t in meta["tables"])
    n = 150  # a pure-Python hash
    lines = Path(run["holdout"][0]).read_text().splitlines()[:n]
    inputs = standalone.Inputs(meta)
    cells = inputs.cells(lines)
    keys, dense = inputs.keys(cells), inputs.dense(cells)
    schema = s.config.data.schema
    assert np.array_equal(keys, frame[list(schema.categorical_names)].to_numpy(np.int64)[:n])
    sparse = standalone.sparse_input(out, meta, keys)
    with pytest.warns(DeprecationWarning):
        model = torch.jit.load(str(out / meta["files"]["model"]))
    with torch.no_grad():
        logits = model(torch.from_numpy(dense), torch.from_numpy(sparse)).numpy()
    prob = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    assert np.abs(prob - run["reference"][-1][:n]).max() < 1e-6

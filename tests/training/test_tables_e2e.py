"""Several tables end to end on a real two-worker cluster: every key lands in its own table's
stores with that table's width, admission is each table's own, a shared table holds one row
per value across its fields, reruns and resumes match bit for bit, and a resume that changes
what a table's rows mean is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from daskhps.config import RunConfig
from daskhps.data.keyspace import TABLE_SHIFT
from daskhps.errors import ResumeError
from daskhps.runfiles.checkpoint import list_checkpoints
from daskhps.table import EmbeddingTable
from daskhps.training.trainer import Trainer
from tests._clusters import SharedClusters
from tests._logs import generated_logs
from tests._runs import set_keys, tiny_config

TABLES = [
    {"name": "ids", "dim": 8, "features": ["C1", "C2", "C3"], "admission": {"min_count": 2}},
    {"name": "small", "dim": 2, "features": ["C{4..6}"], "shared_keys": True},
]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logs(tmp_path_factory, days=1, rows_per_day=2000, parts_per_day=2, seed=5)


def _config(tmp: Path, logs: Path, cluster: dict[str, Any], **over: Any) -> RunConfig:
    d = tiny_config(
        tmp,
        logs,
        passes={"examples_per_pass": 1000},
        tables=TABLES,
        checkpoint={"every_passes": 1},
        cluster_section=cluster,
    )
    set_keys(d, over)
    return RunConfig.from_dict(d, source="test")


def _rows(cfg: RunConfig, workers: int) -> dict[str, dict[int, np.ndarray]]:
    """Every committed row of every table's shards, by table and key."""
    out: dict[str, dict[int, np.ndarray]] = {}
    for spec in cfg.table_specs():
        got = out.setdefault(spec.name, {})
        for r in range(workers):
            path = Path(cfg.table.tiers.store_dir) / spec.name / f"rank-{r}"
            with EmbeddingTable.open(spec, path, device_rows=16, mode="r") as t:
                keys = t.store.keys()
                got.update(zip(keys.tolist(), t.peek(keys).numpy(), strict=True))
    return out


def _equal(a: dict[str, dict[int, np.ndarray]], b: dict[str, dict[int, np.ndarray]]) -> bool:
    return a.keys() == b.keys() and all(
        a[t].keys() == b[t].keys() and all(np.array_equal(a[t][k], b[t][k]) for k in a[t])
        for t in a
    )


@pytest.fixture(scope="module")
def run(
    tmp_path_factory: pytest.TempPathFactory, logs: Path, shared_clusters: SharedClusters
) -> tuple[RunConfig, Any, dict[str, dict[int, np.ndarray]]]:
    cfg = _config(
        tmp_path_factory.mktemp("tables"), logs, shared_clusters.section(workers=2, threads=2)
    )
    result = Trainer(cfg, progress=False).run()
    return cfg, result, _rows(cfg, 2)


def _raw(logs: Path) -> pd.DataFrame:
    """The logs' cells as text, as the parser hashes them (an empty cell: missing)."""
    cols = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
    files = sorted(logs.glob("day=*/*.tsv"))
    return pd.concat(
        pd.read_csv(f, sep="\t", header=None, names=cols, dtype=str, keep_default_na=False)
        for f in files
    )


def _keys(cfg: RunConfig, raw: pd.DataFrame, fields: list[str]) -> np.ndarray:
    """The keys of every cell of ``fields``, as the run's tables make them."""
    names = cfg.data.schema.categorical_names
    keyed = cfg.data.schema.field_keys
    return np.concatenate(
        [keyed.hash(pa.array(raw[f].replace("", None)), names.index(f)) for f in fields]
    )


def test_each_table_holds_its_own_fields_keys_at_its_own_width(run, logs):
    cfg, result, rows = run
    assert [t.name for t in cfg.embedding_tables()] == ["ids", "small", "embeddings"]
    for index, spec in enumerate(cfg.table_specs()):
        keys = np.array(sorted(rows[spec.name]), dtype=np.int64)
        assert len(keys) and (keys >> TABLE_SHIFT == index).all()
        assert {len(v) for v in rows[spec.name].values()} == {spec.width}
    raw = _raw(logs)
    # ids admits a key once seen twice: exactly the keys that occurred twice have rows
    keys, counts = np.unique(_keys(cfg, raw, ["C1", "C2", "C3"]), return_counts=True)
    assert (counts < 2).any()  # the rule had keys to hold back
    assert set(rows["ids"]) == set(keys[counts >= 2].tolist())
    # small shares keys over C4..C6: one row per distinct value of the three fields
    small = _keys(cfg, raw, ["C4", "C5", "C6"])
    assert set(rows["small"]) == set(small.tolist())
    assert len(rows["small"]) == len(set(raw[["C4", "C5", "C6"]].to_numpy().ravel().tolist()))
    # the default table admits every key of the other fields
    rest = [f"C{i}" for i in range(7, 27)]
    assert set(rows["embeddings"]) == set(_keys(cfg, raw, rest).tolist())
    manifest = json.loads((list_checkpoints(cfg.run.dir)[-1].path / "MANIFEST.json").read_text())
    assert manifest["format"] == 2
    assert [t["table"] for t in manifest["tables"]] == ["ids", "small", "embeddings"]
    assert result.final_eval or result.passes


def test_a_resume_matches_a_run_without_a_break_bit_for_bit(logs, tmp_path, shared_clusters):
    section = shared_clusters.section(workers=2, threads=2)
    straight = _config(tmp_path / "straight", logs, section, **{"passes.epochs": 2})
    Trainer(straight, progress=False).run()
    first = _config(tmp_path / "resumed", logs, section)
    Trainer(first, progress=False).run()
    resumed = _config(tmp_path / "resumed", logs, section, **{"passes.epochs": 2})
    Trainer(resumed, progress=False).run(resume=True)
    assert _equal(_rows(resumed, 2), _rows(straight, 2))


def test_a_resume_that_changes_a_tables_dim_or_features_is_refused(run, tmp_path, logs):
    cfg, _, _ = run
    for key, value in (("dim", 4), ("features", ["C1", "C2"])):
        tables = [dict(t) for t in TABLES]
        tables[0][key] = value
        d = cfg.to_dict()
        d["tables"] = tables
        changed = RunConfig.from_dict(d, source="changed.yaml")
        with pytest.raises(ResumeError, match=rf"tables\[0\]\.{key}|tables"):
            Trainer(changed, progress=False).run(resume=True)

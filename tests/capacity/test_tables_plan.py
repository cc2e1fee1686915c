"""``daskhps plan`` and the trainer's early check for a run with several tables: each table's
keys counted by the index every key carries, each table's tiers and stores sized with its own
width and rows and summed into the worker's, a table whose pass does not fit its own device
tier refused by name, and a run with one table sized as it always was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from daskhps.capacity import check_fits, size_run
from daskhps.capacity.command import render
from daskhps.capacity.estimate import index_transient_bytes
from daskhps.capacity.fit import SizingReport
from daskhps.capacity.stored import stored_table
from daskhps.config import RunConfig
from daskhps.data.keyspace import TABLE_SHIFT
from daskhps.data.readers import read_click_log
from daskhps.errors import CapacityError
from daskhps.runfiles.checkpoint import latest_checkpoint
from daskhps.sharding import ShardMap
from daskhps.table import EmbeddingTable
from daskhps.tiers.host import rows_for_bytes
from daskhps.training.trainer import Trainer
from tests._clusters import PLANNED_MEMORY, SharedClusters
from tests._runs import set_keys

TABLES = [
    {"name": "ids", "dim": 8, "features": ["C3", "C4", "C12"], "admission": {"min_count": 2}},
    {"name": "small", "dim": 2, "features": ["C{5..9}"], "shared_keys": True},
]
WORKERS, SHARDS, PASS = 2, 8, 1000


def _config(tmp: Path, logs: Path | None = None, **keys: Any) -> RunConfig:
    """Three tables (ids, small, and the default table of the other 18 fields) over 3000 rows
    of generated logs (one day in 3 parts: 3 passes), on 2 workers."""
    d: dict[str, Any] = {
        "run": {"name": "p", "dir": str(tmp / "run"), "quiet": True, "seed": 1},
        "data": {
            "generate": {
                "out": str(logs or tmp / "logs"),
                "days": 1,
                "rows_per_day": 3000,
                "parts_per_day": 3,
                "vocab_scale": 0.01,
                "seed": 2,
            }
        },
        "passes": {"examples_per_pass": PASS, "global_batch_size": 100, "num_shards": SHARDS},
        "table": {"dim": 4, "tiers": {"device": {"rows": 5000}, "host": {"fraction": 0.05}}},
        "tables": TABLES,
        "model": {"name": "dlrm", "options": {"bottom_mlp": [8, 2], "top_mlp": [8]}},
        "cluster": {"n_workers": WORKERS, "memory_limit": PLANNED_MEMORY, "gpu": False},
    }
    return RunConfig.from_dict(set_keys(d, keys), source="run.yaml")


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("tables-plan")
    cfg = _config(tmp)
    assert cfg.data.generate is not None
    cfg.data.generate.ensure()
    return tmp / "logs"


@pytest.fixture(scope="module")
def scanned(logs: Path, tmp_path_factory: pytest.TempPathFactory) -> SizingReport:
    return size_run(_config(tmp_path_factory.mktemp("scanned"), logs), scan=True)


def test_scan_counts_each_tables_keys_as_pandas_does(
    logs: Path, scanned: SizingReport, tmp_path: Path
) -> None:
    cfg = _config(tmp_path, logs)
    frame = read_click_log(cfg.data.source).frame.compute()  # the run's schema: tagged keys
    keys = frame[list(cfg.data.schema.categorical_names)].to_numpy(np.int64)
    assert set(np.unique(keys >> TABLE_SHIFT)) == {0, 1, 2}  # ids, small, the default table
    shard_map = ShardMap(SHARDS, WORKERS)

    def per_owner(k: np.ndarray) -> np.ndarray:
        return np.bincount((shard_map.shard(k) * WORKERS) // SHARDS, minlength=WORKERS)

    stats = scanned.keys
    names = [t.name for t in cfg.embedding_tables()]
    assert [t.name for t in stats.tables] == names == ["ids", "small", "embeddings"]
    for t, got in enumerate(stats.tables):
        mine = keys[keys >> TABLE_SHIFT == t]
        every = np.unique(mine)
        assert got.source == "scan"
        assert got.distinct_keys == every.size
        assert got.keys_per_owner == per_owner(every).max()
        rows = [keys[a : a + PASS] for a in range(0, len(keys), PASS)]
        passes = [np.unique(r[r >> TABLE_SHIFT == t]) for r in rows]
        assert list(got.pass_keys_per_owner) == [per_owner(p).max() for p in passes]
        assert got.largest_pass_keys == max(p.size for p in passes)
        assert got.largest_pass_per_owner == max(got.pass_keys_per_owner)
    # The run's figures: every table's keys together, per owner.
    assert (
        stats.distinct_keys
        == np.unique(keys).size
        == sum(t.distinct_keys or 0 for t in stats.tables)
    )
    assert stats.keys_per_owner == per_owner(np.unique(keys)).max()
    # The config's bounds (each field's vocabulary) bound each table's counted keys.
    bound = size_run(cfg).keys
    assert bound.source == "bound" and len(bound.tables) == 3
    for b, c in zip(bound.tables, stats.tables, strict=True):
        assert b.name == c.name and b.source == "bound"
        assert b.distinct_keys is not None and c.distinct_keys is not None
        assert b.largest_pass_keys is not None and c.largest_pass_keys is not None
        assert b.distinct_keys >= c.distinct_keys and b.largest_pass_keys >= c.largest_pass_keys
    assert bound.distinct_keys == sum(b.distinct_keys or 0 for b in bound.tables)


def test_each_tables_memory_and_disk_add_up_to_the_workers(
    scanned: SizingReport, tmp_path: Path
) -> None:
    memory = scanned.memory
    assert memory is not None and len(memory.tables) == len(scanned.tables) == 3
    parts = memory.tables
    assert memory.device.rows == sum(t.device.rows for t in parts) == 3 * 5000
    assert memory.device.total == sum(t.device.total for t in parts)
    assert memory.host is not None
    assert memory.host.total == sum(t.host.total for t in parts if t.host is not None)
    assert memory.store == sum(t.store for t in parts)
    assert memory.store_mapped == sum(t.store_mapped for t in parts)
    assert memory.tiers == sum(t.total for t in parts)
    assert memory.store_index == max(t.store_index for t in parts)
    # Each table at its own width, with the rows and host bytes the workers resolve for it.
    cfg = _config(tmp_path)
    specs = cfg.table_specs()
    assert [(t.name, t.dim, t.width) for t in scanned.tables] == [
        (s.name, s.dim, s.width) for s in specs
    ]
    assert [t.device.width for t in parts] == [s.width for s in specs]
    assert len({s.width for s in specs}) == 3 and memory.device.width is None
    # The shared host budget is split as the workers split it: by each table's keys in a
    # pass (the largest here), so the table with more keys gets more rows.
    largest = {t.name: t.keys.largest_pass_per_owner for t in scanned.tables}
    assert None not in largest.values()
    pass_keys = {name: int(k or 0) for name, k in largest.items()}
    assert len(set(pass_keys.values())) == 3
    budgets = cfg.tier_sizing().resolve(specs, PLANNED_MEMORY, keys=pass_keys)
    assert [(t.device.rows, t.host.rows if t.host else 0) for t in parts] == [
        (budgets[s.name][0], rows_for_bytes(s.width, budgets[s.name][1])) for s in specs
    ]
    host_rows = [t.host.rows for t in parts if t.host is not None]
    by_keys = sorted(range(3), key=lambda i: pass_keys[specs[i].name])
    assert len(host_rows) == 3 and sorted(range(3), key=lambda i: host_rows[i]) == by_keys
    assert sum(len(t.fields) for t in scanned.tables) == 26
    disks = [t.disk for t in scanned.tables]
    for name in ("live", "history", "snapshots", "compaction_headroom"):
        assert getattr(scanned.disk, name) == sum(getattr(d, name) for d in disks), name
    assert scanned.disk.stores == sum(d.stores or 0 for d in disks)
    # The JSON's tables and the text's block say the same.
    out = scanned.to_dict()
    assert [t["name"] for t in out["tables"]] == ["ids", "small", "embeddings"]
    assert out["tables"][0]["memory_per_worker"]["device"]["rows"] == 5000
    assert json.loads(json.dumps(out))["memory_per_worker"]["device"]["width"] is None
    text = render(scanned)
    assert "tables (" in text and "rows of 3 tables" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("small"))
    small = scanned.tables[1]
    assert line.split()[:5] == [
        "small",
        "2",
        str(specs[1].width),
        "5",
        f"{small.keys.distinct_keys:,}",
    ]


def test_a_table_whose_pass_does_not_fit_its_device_tier_is_refused_by_name(
    logs: Path, tmp_path: Path
) -> None:
    own = [{**TABLES[0], "tiers": {"device": {"rows": 100}}}, TABLES[1]]
    cfg = _config(tmp_path, logs, tables=own)
    report = size_run(cfg, scan=True)
    (problem,) = report.problems
    assert problem.startswith("table 'ids': the largest pass stages")
    assert "tables[0].tiers.device.rows 100" in problem
    # A table that shares the run's device budget names that key, and how to give it its own.
    shared = size_run(_config(tmp_path, logs, **{"table.tiers.device.rows": 100}), scan=True)
    ids = next(p for p in shared.problems if p.startswith("table 'ids'"))
    assert "table.tiers.device.rows 100" in ids and "tables[0].tiers.device" in ids
    assert any(p.startswith("table 'embeddings'") for p in shared.problems)
    # Bounds from the config are plan's to say, as bounds, naming the table; the trainer's
    # check lets it start and says nothing (it counts each pass when it stages it).
    report = check_fits(cfg)
    assert report.fits and not any("table 'ids'" in w for w in report.warnings)
    (bound,) = [b for b in report.upper_bounds if b.startswith("table 'ids'")]
    assert "at most" in bound and "(an upper bound; `daskhps plan --scan` counts them)" in bound
    # The run's stated keys (all tables') refuse what cannot fit the tables' rows together.
    stated = _config(
        tmp_path, logs, **{"table.expected_keys": 100_000, "table.tiers.device.rows": 100}
    )
    with pytest.raises(CapacityError, match=r"device tiers of its 3 tables .* hold 300 rows"):
        check_fits(stated)


def test_one_table_is_sized_as_before(logs: Path, tmp_path: Path) -> None:
    # One tables entry holding every field is the run's one table: untagged keys, the same plan.
    every = [{"name": "all", "features": ["C{1..26}"]}]
    one = size_run(_config(tmp_path, logs, tables=every, **{"table.name": "all"}), scan=True)
    plain = size_run(_config(tmp_path, logs, tables=None, **{"table.name": "all"}), scan=True)
    assert not one.tables and not one.keys.tables
    a, b = one.to_dict(), plain.to_dict()
    for d in (a, b):
        d["disk"].pop("free")
    assert a == b and "tables" not in a
    text = render(plain)
    width = plain.memory.device.width if plain.memory else None
    assert "\ntables (" not in text and f"5,000 rows x {width} floats" in text


def test_a_resume_sizes_each_tables_stores_by_the_rows_they_hold(
    logs: Path, tmp_path: Path, shared_clusters: SharedClusters
) -> None:
    section = shared_clusters.section(workers=WORKERS, threads=2)
    one_pass = {"passes.examples_per_pass": 3000, "checkpoint": {"every_passes": 1}}
    cfg = _config(tmp_path, logs, cluster=section, **one_pass)
    Trainer(cfg, progress=False).run()  # its early check sizes the tables (check_fits)
    stored = stored_table(cfg.run.dir)
    ckpt = latest_checkpoint(cfg.run.dir)
    assert stored is not None and ckpt is not None
    held: dict[str, list[int]] = {}
    for spec in cfg.table_specs():
        held[spec.name] = []
        for rank in range(WORKERS):
            with EmbeddingTable.open(
                spec, ckpt.store_path(rank, spec.name), device_rows=16, mode="r"
            ) as t:
                held[spec.name].append(len(t.store))
    assert dict(stored.tables) == {name: tuple(rows) for name, rows in held.items()}
    assert list(stored.rows_per_rank) == [sum(r[k] for r in held.values()) for k in (0, 1)]
    report = size_run(cfg, workers=WORKERS, memory_limit=PLANNED_MEMORY)  # what --resume opens
    assert report.memory is not None
    for part in report.memory.tables:
        assert stored.busiest_of(part.name) == max(held[part.name])
        assert part.store_index >= index_transient_bytes(max(held[part.name]), 0)

"""Every table's stores, wherever a checkpoint's stores move or are read: re-sharding when the
worker count changes (on the driver and on the workers), the copy at checkpoint.replicate_to
(mirror and restore), ``inspect``, damage of any table's commit, publishing a retraining
candidate, and ``daskhps import`` of every table (an export of the run, imported into a new
run that trains on). One 3-table run on 2 workers is trained once for the module (config shape
of test_tables_e2e.py); tests that change it copy it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from daskhps.cli import main
from daskhps.config import RunConfig
from daskhps.data.keyspace import TABLE_SHIFT
from daskhps.data.source import SUCCESS
from daskhps.distributed import reshard_on_workers, start_cluster
from daskhps.retrain import ExitCode, Registry
from daskhps.runfiles.checkpoint import (
    Checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    store_damage,
)
from daskhps.runfiles.replica import Replica, restore_stores
from daskhps.serve import Servable, load_servable
from daskhps.serve.export import export_model
from daskhps.sharding import ShardMap
from daskhps.table import open_shard_store
from daskhps.table.admission import PendingCounts
from daskhps.training.inspection import describe, render
from daskhps.training.resume import reshard, resharded_dir
from daskhps.training.trainer import Trainer
from tests._clusters import SharedClusters
from tests._logs import generated_logs
from tests._runs import set_keys, tiny_config

TABLES = [
    {"name": "ids", "dim": 8, "features": ["C1", "C2", "C3"], "admission": {"min_count": 2}},
    {"name": "small", "dim": 2, "features": ["C{4..6}"], "shared_keys": True},
]
NAMES = ["ids", "small", "embeddings"]

Rows = dict[str, dict[int, np.ndarray]]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logs(tmp_path_factory, days=3, rows_per_day=1000, parts_per_day=1, seed=5)


def _config(run: Path, train: list[Path], cluster: dict[str, Any], **over: Any) -> dict[str, Any]:
    d = tiny_config(
        run,
        train[0],
        passes={"examples_per_pass": 500},
        tables=TABLES,
        checkpoint={"every_passes": 1, "replicate_to": str(run.parent / f"{run.name}-copy")},
        cluster_section=cluster,
    )
    d["data"]["train"]["paths"] = [str(p) for p in train]
    return set_keys(d, over)


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory, logs: Path, shared_clusters: SharedClusters
) -> Checkpoint:
    """The last checkpoint of a 3-table run on 2 workers: one day, 2 passes."""
    run = tmp_path_factory.mktemp("tables") / "run"
    d = _config(run, [logs / "day=2024-01-01"], shared_clusters.section(workers=2, threads=2))
    Trainer(RunConfig.from_dict(d, source="test"), progress=False).run()
    return list_checkpoints(run)[-1]


def _copy_run(ckpt: Checkpoint, to: Path) -> Checkpoint:
    """The checkpoint ``ckpt`` in a copy of its run folder (stores inside it)."""
    run = ckpt.path.parent.parent
    shutil.copytree(run, to, symlinks=True)
    return load_checkpoint(to / "checkpoints" / ckpt.name)


def _stores(path: Path, spec: Any, commit: str) -> tuple[dict[int, np.ndarray], PendingCounts]:
    with open_shard_store(spec, path, mode="r", commit=commit) as s:
        keys = s.keys()
        rows = s.lookup(keys).rows.numpy()
        pending = PendingCounts.from_arrays(
            s.attached(PendingCounts.KEYS), s.attached(PendingCounts.STATS)
        )
    return dict(zip(keys.tolist(), rows, strict=True)), pending


def _by_rank(ckpt: Checkpoint, folder: Path, workers: int) -> dict[str, list[Any]]:
    """Per table, per rank: the rows and pending counts of ``folder``'s stores at the commit."""
    return {
        spec.name: [
            _stores(folder / spec.name / f"rank-{r}", spec, ckpt.commit) for r in range(workers)
        ]
        for spec in ckpt.table_specs
    }


def _check_owners(got: dict[str, list[Any]], was: dict[str, list[Any]], ckpt: Checkpoint) -> None:
    """Every row and pending count of every table of ``was`` is in ``got`` exactly once, at
    the new owner of its full key, bit for bit."""
    for index, name in enumerate(NAMES):
        owners = ShardMap(ckpt.num_shards, len(got[name]))
        old_rows = {k: v for rows, _ in was[name] for k, v in rows.items()}
        old_pending = {
            int(k): s.tolist() for _, p in was[name] for k, s in zip(p.keys, p.stats, strict=True)
        }
        seen: dict[int, np.ndarray] = {}
        pending: dict[int, list[float]] = {}
        for r, (rows, p) in enumerate(got[name]):
            keys = np.array(sorted(rows), dtype=np.int64)
            assert (owners.worker(keys) == r).all() and (keys >> TABLE_SHIFT == index).all()
            assert not set(rows) & set(seen)
            seen.update(rows)
            assert (owners.worker(p.keys) == r).all() and not set(p.keys.tolist()) & set(pending)
            pending.update({int(k): s.tolist() for k, s in zip(p.keys, p.stats, strict=True)})
        assert seen.keys() == old_rows.keys() and len(seen) > 0
        assert all(np.array_equal(seen[k], old_rows[k]) for k in seen)
        assert pending == old_pending
    assert sum(len(p) for _, p in was["ids"]) > 0  # admission held keys back: counts moved


def test_reshard_on_the_driver_moves_every_tables_rows_and_pending_counts(trained, tmp_path):
    ckpt = trained
    was = _by_rank(ckpt, ckpt.stores_dir, ckpt.num_workers)
    for n in (1, 3):
        out = reshard(ckpt, n, tmp_path / f"w{n}")
        _check_owners(_by_rank(ckpt, out, n), was, ckpt)


def test_a_resume_on_one_worker_reshards_every_table_and_trains_on(
    trained, tmp_path, logs, shared_clusters
):
    """The 2-worker checkpoint re-sharded on the workers onto 1 writes what the driver's
    re-shard writes, every table's; a resume on 1 worker then trains its second epoch."""
    ckpt = _copy_run(trained, tmp_path / "run")
    with start_cluster(address=shared_clusters.address(1, 2), n_workers=1) as cluster:
        (a,) = cluster.addresses
        reshard_on_workers(cluster.client, ckpt, {0: a, 1: a}, [a], tmp_path / "workers")
    got = _by_rank(ckpt, tmp_path / "workers", 1)
    want = _by_rank(ckpt, reshard(ckpt, 1, tmp_path / "driver"), 1)
    _check_owners(got, _by_rank(ckpt, ckpt.stores_dir, 2), ckpt)
    for name in NAMES:
        (rows, pending), (old, old_pending) = got[name][0], want[name][0]
        assert rows.keys() == old.keys() and all(np.array_equal(rows[k], old[k]) for k in rows)
        assert np.array_equal(pending.keys, old_pending.keys)
        assert np.array_equal(pending.stats, old_pending.stats)
    section = shared_clusters.section(workers=1, threads=2)
    d = _config(tmp_path / "run", [logs / "day=2024-01-01"], section, **{"passes.epochs": 2})
    result = Trainer(RunConfig.from_dict(d, source="test"), progress=False).run(resume=True)
    last = list_checkpoints(tmp_path / "run")[-1]
    assert last.passes_done == 4 and last.num_workers == 1 and len(result.passes) == 4
    assert last.stores_dir == resharded_dir(tmp_path / "run" / "stores", ckpt, 1)
    assert last.table_names == tuple(NAMES) and store_damage(last) == []


def test_the_copy_mirrors_and_restores_every_tables_stores(trained, tmp_path):
    replica = Replica(trained.config.checkpoint.replicate_to or "")
    copied = replica.local_checkpoint(trained.name)
    assert isinstance(copied, Checkpoint) and copied.table_names == tuple(NAMES)
    assert store_damage(copied, verify=True) == []  # every table's store of every rank
    ckpt = _copy_run(trained, tmp_path / "run")
    shutil.rmtree(ckpt.store_path(1, "small"))  # the second table's store of rank 1 is lost
    (ckpt.store_path(0, "embeddings") / "zarr.json").unlink()  # and the third's of rank 0
    assert len(store_damage(ckpt)) == 2
    done = restore_stores(ckpt, replica)
    assert len(done) == 2 and store_damage(ckpt, verify=True) == []
    want = _by_rank(trained, trained.stores_dir, 2)
    got = _by_rank(ckpt, ckpt.stores_dir, 2)
    for name in NAMES:
        for (rows, _), (old, _) in zip(got[name], want[name], strict=True):
            assert rows.keys() == old.keys()
            assert all(np.array_equal(rows[k], old[k]) for k in rows)


def test_inspect_shows_every_table(trained):
    info = describe(trained.path)
    (c,) = info["checkpoints"]
    assert not info["damaged"] and c["format"] == 2
    assert [t["name"] for t in c["tables"]] == NAMES
    assert [t["dim"] for t in c["tables"]] == [8, 2, 4]
    counts = {
        name: sum(len(rows) for rows, _ in ranks)
        for name, ranks in _by_rank(trained, trained.stores_dir, 2).items()
    }
    assert {t["name"]: t["rows"] for t in c["tables"]} == counts
    assert c["rows"] == sum(counts.values())
    # each table's bytes when taken, recorded by the checkpoint: they add up to its total
    assert all(t["store_bytes"] > 0 for t in c["tables"])
    assert sum(t["store_bytes"] for t in c["tables"]) == c["store_bytes"]
    assert c["tables"][0]["pending_keys"] > 0  # ids admits at 2 sightings
    text = render(info)
    for t in c["tables"]:
        assert f"table {t['name']} dim {t['dim']} " in text and f"{t['rows']:,} rows" in text


def test_a_damaged_commit_of_the_second_table_is_found(trained, tmp_path):
    ckpt = _copy_run(trained, tmp_path / "run")
    text = (ckpt.path / "MANIFEST.json").read_text()
    manifest = json.loads(text)
    manifest["shards"][1]["tables"]["small"]["commit_seq"] += 1  # another commit of the name
    (ckpt.path / "MANIFEST.json").write_text(json.dumps(manifest))
    damage = store_damage(load_checkpoint(ckpt.path))
    assert len(damage) == 1 and damage[0].startswith("table small, rank 1: ")
    # inspect then reads the copy: the store here holds other rows
    copy = describe(ckpt.path)["checkpoints"][0]["read_from_copy"]
    assert copy is not None and "small/rank-1 holds other rows" in copy["why"]
    (ckpt.path / "MANIFEST.json").write_text(text)
    # a truncated segment file of the second table is found by its size, and inspect says so
    segment = max(
        (p for p in ckpt.store_path(0, "small").rglob("*") if p.is_file() and "seg" in str(p)),
        key=lambda p: p.stat().st_size,
    )
    segment.write_bytes(segment.read_bytes()[:-1])
    info = describe(ckpt.path)
    assert info["damaged"] and any("table small" in d for d in info["damage"])
    assert "DAMAGED rank 0: table small" in render(info)


@pytest.fixture(scope="module")
def exported(trained: Checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``daskhps export`` of the trained run: keys-<table>.npy, embeddings-<table>.npy."""
    out = tmp_path_factory.mktemp("export") / "export"
    export_model(Servable.from_checkpoint(trained), out)
    return out


def _import_config(trained: Checkpoint, folder: Path) -> Path:
    """The trained run's config, for a new run in ``folder``."""
    d = trained.config.to_dict()
    run = folder / "run"
    set_keys(d, {"run.dir": str(run), "table.tiers.store_dir": str(run / "stores")})
    set_keys(d, {"checkpoint.replicate_to": None})
    path = folder / "import.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def _export_args(out: Path, names: list[str]) -> list[str]:
    rows = [f"{n}={out / f'embeddings-{n}.npy'}" for n in names]
    return ["--rows", *rows, "--keys", *[f"{n}={out / f'keys-{n}.npy'}" for n in names]]


def test_an_export_of_every_table_imports_as_a_run_that_trains_on(
    trained, exported, tmp_path, capsys, logs, shared_clusters
):
    """The export of the 3-table run imported into a new run on 3 rank stores: a format-2
    checkpoint whose stores hold every table's exported rows, bit for bit, each at its owner;
    inspect and serving read it; a resume on 2 workers re-shards it and trains on."""
    config = _import_config(trained, tmp_path)
    args = ["import", str(config), "--quiet", "--workers", "3", *_export_args(exported, NAMES)]
    assert main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "rank store(s) per table" in out and "table small: " in out
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None and ckpt.name == "pass-000000" and ckpt.format == 2
    assert ckpt.table_names == tuple(NAMES) and ckpt.tables == trained.tables
    assert ckpt.num_workers == 3 and store_damage(ckpt, verify=True) == []
    got = _by_rank(ckpt, ckpt.stores_dir, 3)
    was = _by_rank(trained, trained.stores_dir, 2)
    owners = ShardMap(ckpt.num_shards, 3)
    for index, spec in enumerate(ckpt.table_specs):
        keys = np.load(exported / f"keys-{spec.name}.npy")
        want = np.load(exported / f"embeddings-{spec.name}.npy")
        rows: dict[int, np.ndarray] = {}
        for r, (mine, pending) in enumerate(got[spec.name]):
            ks = np.array(sorted(mine), dtype=np.int64)
            assert (owners.worker(ks) == r).all() and (ks >> TABLE_SHIFT == index).all()
            assert len(pending) == 0  # an import holds no admission counts
            rows.update(mine)
        assert sorted(rows) == sorted(keys.tolist()) and len(rows) > 0
        stored = np.stack([rows[k] for k in keys.tolist()])
        assert np.array_equal(stored[:, : spec.dim].view(np.int32), want.view(np.int32))
        # the trained run's rows of the table, bit for bit
        old = {k: v for mine, _ in was[spec.name] for k, v in mine.items()}
        assert all(np.array_equal(rows[k][: spec.dim], old[k][: spec.dim]) for k in rows)
        assert not stored[:, spec.dim :].any()  # initial adagrad state (0), never counted
    info = describe(ckpt.path)["checkpoints"][0]
    assert info["format"] == 2 and [t["name"] for t in info["tables"]] == NAMES
    assert [t["rows"] for t in info["tables"]] == [
        len(np.load(exported / f"keys-{n}.npy")) for n in NAMES
    ]
    assert sum(t["store_bytes"] for t in info["tables"]) == info["store_bytes"] > 0
    assert [v.spec.name for v in load_servable(tmp_path / "run").tables] == NAMES

    d = yaml.safe_load(config.read_text())
    d["cluster"] = shared_clusters.section(workers=2, threads=2)
    result = Trainer(RunConfig.from_dict(d, source="test"), progress=False).run(resume=True)
    last = list_checkpoints(tmp_path / "run")[-1]
    assert last.passes_done == 2 and last.num_workers == 2 and len(result.passes) == 2
    assert last.table_names == tuple(NAMES) and store_damage(last) == []
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["staged_from"]["store"] > 0  # the imported rows, staged from the stores


def test_a_table_given_no_rows_starts_empty(trained, exported, tmp_path, capsys):
    config = _import_config(trained, tmp_path)
    args = ["import", str(config), "--quiet", "--workers", "2", "--json"]
    assert main([*args, *_export_args(exported, ["small"])]) == 0, capsys.readouterr().err
    res = json.loads(capsys.readouterr().out)
    n = len(np.load(exported / "keys-small.npy"))
    assert res["rows"] == n and [t["rows"] for t in res["tables"].values()] == [0, n, 0]
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None and store_damage(ckpt, verify=True) == []
    info = describe(ckpt.path)["checkpoints"][0]
    assert [t["rows"] for t in info["tables"]] == [0, n, 0]


def _listing(folder: Path) -> dict[str, int | None]:
    return {
        str(p): p.stat().st_mtime_ns if p.is_file() else None for p in sorted(folder.rglob("*"))
    }


def test_bad_inputs_of_several_tables_fail_in_one_line(trained, exported, tmp_path, capsys):
    config = _import_config(trained, tmp_path)
    small_keys = np.load(exported / "keys-small.npy")
    ids_key = int(np.load(exported / "keys-ids.npy")[0])
    other = small_keys.copy()
    other[3] = ids_key  # a key of table ids among small's
    np.save(tmp_path / "other.npy", other)
    untagged = small_keys.copy()
    untagged[5] = (100 << TABLE_SHIFT) | 12345  # a table this config has not
    np.save(tmp_path / "untagged.npy", untagged)
    small = f"small={exported / 'embeddings-small.npy'}"
    swapped = [
        "--rows",
        small.replace("small=", "ids="),
        "--keys",
        f"ids={exported / 'keys-small.npy'}",
    ]
    ids_rows = f"ids={exported / 'embeddings-ids.npy'}"
    cases = [
        (  # small's rows (2 floats) given as ids' (8)
            swapped,
            ["embeddings-small.npy row 0: 2 floats", "table 'ids' has 8 (tables[0].dim)"],
        ),
        (
            ["--rows", small, "--keys", f"small={tmp_path / 'other.npy'}"],
            [f"other.npy row 3: key {ids_key} carries table 0 (ids)", "table 'small' (table 1)"],
        ),
        (
            ["--rows", small, "--keys", f"small={tmp_path / 'untagged.npy'}"],
            ["untagged.npy row 5: key", "carries table 100", "keys-small.npy"],
        ),
        (["--rows", f"tiny={exported / 'embeddings-small.npy'}"], ["has no table 'tiny'"]),
        (
            ["--rows", str(exported / "embeddings-ids.npy")],
            ["TABLE=PATH", "ids, small, embeddings"],
        ),
        (["--rows", ids_rows], ["--keys ids=KEYS.npy", "keys-ids.npy"]),
        (
            ["--rows", small, *_export_args(exported, ["small", "ids"])[3:]],
            ["no --rows ids=", "leave out --keys ids="],
        ),
    ]
    before = _listing(tmp_path)
    for args, needles in cases:
        rc = main(["import", str(config), "--quiet", "--workers", "2", *args])
        err = capsys.readouterr().err.strip()
        assert rc == 1 and len(err.splitlines()) == 1, err
        assert err.startswith("daskhps import: error: "), err
        for needle in needles:
            assert needle in err, (needle, err)
        assert _listing(tmp_path) == before  # nothing written, nothing left behind


def _arrive(logs: Path, live: Path, day: str) -> None:
    shutil.copytree(logs / f"day={day}", live / f"day={day}")
    (live / f"day={day}" / SUCCESS).write_text("")


def test_retraining_a_run_of_several_tables_warm_starts_from_the_published_version(
    tmp_path, logs, capsys, shared_clusters
):
    live = tmp_path / "logs"
    section = shared_clusters.section(workers=1, threads=2)
    d = _config(tmp_path / "run", [live], section, **{"retrain.max_auc_drop": 1.0})
    set_keys(d, {"data.train.require_complete": True, "eval.every_pass": False})
    set_keys(d, {"retrain.max_logloss_rise": 1.0, "checkpoint.replicate_to": None})
    cfg = tmp_path / "retrain.yaml"
    cfg.write_text(yaml.safe_dump(d))
    registry = Registry(tmp_path / "run" / "versions")
    for day in ("2024-01-01", "2024-01-02"):
        _arrive(logs, live, day)
    assert main(["retrain", str(cfg)]) == ExitCode.PUBLISHED, capsys.readouterr().err
    _arrive(logs, live, "2024-01-03")
    assert main(["retrain", str(cfg)]) == ExitCode.PUBLISHED, capsys.readouterr().err
    v2 = registry.current()
    assert v2 is not None and v2.name == "v000002" and v2.parent == "v000001"
    for v in registry.versions():
        ckpt = load_checkpoint(v.checkpoint)
        assert ckpt.commit == f"version-{v.name}" and ckpt.table_names == tuple(NAMES)
        assert store_damage(ckpt) == []  # every table committed as the version, recorded
        for name in NAMES:
            with ckpt.open_store(0, table=name) as store:
                assert len(store) > 0
        # each table's bytes, as the candidate recorded them, are the version's too
        info = describe(ckpt.path)["checkpoints"][0]
        assert sum(t["store_bytes"] for t in info["tables"]) == info["store_bytes"] > 0

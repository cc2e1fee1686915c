"""``daskhps import``: existing embeddings become a run's starting table.

Real files (numpy ``.npy``, parquet), real zarr stores, the command line in process (``main``)
and, for the training check, runs on a real LocalCluster. Every bad input ends in one line
naming the file and the row, and leaves the folders exactly as they were.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from daskhps.cli import main
from daskhps.runfiles.checkpoint import latest_checkpoint, list_checkpoints
from daskhps.serve import load_servable
from daskhps.serve.export import export_model
from daskhps.serve.stores import ShardedStores
from daskhps.sharding import ShardMap
from daskhps.table.stats import STATS_WIDTH
from daskhps.training import worker
from daskhps.training.trainer import Trainer
from tests._clusters import SharedClusters
from tests._runs import tiny_config, write_config

DIM = 4


def _config(tmp: Path, workers: int = 1, optimizer: dict[str, Any] | None = None) -> Path:
    table: dict[str, Any] = {"dim": DIM}
    if optimizer is not None:
        table["optimizer"] = optimizer
    d = tiny_config(tmp / "run", tmp / "logs", cluster={"n_workers": workers}, table=table)
    return write_config(tmp / "run.yaml", d)


def _keys(n: int, seed: int = 0) -> np.ndarray:
    """``n`` distinct int64 keys, negative ones among them."""
    return np.random.default_rng(seed).choice(1 << 62, n, replace=False) - (1 << 61)


def _rows(n: int, width: int = DIM, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, width), dtype=np.float32)


def _save(folder: Path, **arrays: np.ndarray) -> dict[str, str]:
    paths = {}
    for name, a in arrays.items():
        paths[name] = str(folder / f"{name}.npy")
        np.save(paths[name], a)
    return paths


def _npy_args(paths: dict[str, str]) -> list[str]:
    args = ["--keys", paths["keys"], "--rows", paths["rows"]]
    return [*args, "--state", paths["state"]] if "state" in paths else args


def _import(capsys: pytest.CaptureFixture[str], config: Path, *args: str) -> tuple[int, str]:
    rc = main(["import", str(config), "--quiet", *args])
    return rc, capsys.readouterr().err


def _listing(folder: Path) -> dict[str, tuple[int, int] | None]:
    """Every entry under ``folder``, hidden ones too; files with (size, mtime)."""
    out: dict[str, tuple[int, int] | None] = {}
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            out[os.path.join(root, d)] = None
        for f in files:
            st = os.stat(os.path.join(root, f))
            out[os.path.join(root, f)] = (st.st_size, st.st_mtime_ns)
    return out


def _fails(capsys: pytest.CaptureFixture[str], config: Path, args: list[str], *needles: str) -> str:
    """The import fails with one line holding each needle, and changes nothing on disk."""
    before = _listing(config.parent)
    rc, err = _import(capsys, config, *args)
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, err
    assert lines[0].startswith("daskhps import: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert _listing(config.parent) == before
    return lines[0]


def _table_rows(
    run_dir: Path, keys: np.ndarray, *, trained: bool = False
) -> tuple[np.ndarray, int]:
    """The rows of ``keys`` but their statistics (weights and optimizer state, what an import
    gives) as serving reads them from the run's latest checkpoint, and how many of them no
    store held. An imported row was never counted: its statistics are zero unless
    ``trained`` since."""
    stores = ShardedStores(load_servable(run_dir).table)
    try:
        rows = stores.read(torch.from_numpy(keys)).numpy()
        assert trained or not rows[:, -STATS_WIDTH:].any()
        return rows[:, :-STATS_WIDTH], stores.initialised
    finally:
        stores.close()


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.int32)


# -- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_export_import_round_trip_is_bit_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: int
) -> None:
    n = 5000
    keys, rows = _keys(n), _rows(n)
    rows[0, 0], rows[1, 1], rows[2, 2] = 1e-45, -0.0, 3.4e38  # odd bits survive
    first = _config(tmp_path / "a", workers=workers)
    # small chunks: many segments per store, each chunk's rows spread over every rank
    paths = _save(tmp_path, keys=keys, rows=rows)
    rc, err = _import(capsys, first, *_npy_args(paths), "--chunk-rows", "700")
    assert rc == 0, err
    run_a = tmp_path / "a" / "run"
    got, unseen = _table_rows(run_a, keys)
    assert unseen == 0
    assert np.array_equal(_bits(got[:, :DIM]), _bits(rows))
    assert not got[:, DIM:].any()  # adagrad, initial_accumulator 0: the state starts at 0

    ckpt = latest_checkpoint(run_a)
    assert ckpt is not None and ckpt.name == "pass-000000" and ckpt.num_workers == workers
    owners = ShardMap(ckpt.num_shards, workers)
    for r in range(workers):  # each key in its owner's store, as training routes it
        with ckpt.open_store(r) as store:
            mine = store.keys().numpy()
            assert (owners.worker(mine) == r).all() and len(mine) > 0

    # export what was imported, import the export into a run on the other worker count
    exported = export_model(load_servable(run_a), tmp_path / "export")
    assert exported.keys == n
    second = _config(tmp_path / "b", workers=3 - workers)
    out = tmp_path / "export"
    rc, err = _import(
        capsys,
        second,
        "--keys",
        str(out / "keys.npy"),
        "--rows",
        str(out / "embeddings.npy"),
        "--chunk-rows",
        "700",
    )
    assert rc == 0, err
    again, unseen = _table_rows(tmp_path / "b" / "run", keys)
    assert unseen == 0 and np.array_equal(_bits(again), _bits(got))


def _parquet(path: Path, columns: dict[str, Any]) -> Path:
    pq.write_table(pa.table(columns), path, row_group_size=300)
    return path


def test_parquet_list_and_numbered_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = 1000
    keys, rows = _keys(n), _rows(n)
    data = tmp_path / "data"
    data.mkdir()
    # one file with a fixed-size list column of float32, one with float64 list rows, one with
    # a column per float: the folder holds every form
    _parquet(
        data / "a.parquet",
        {
            "key": keys[:400],
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(rows[:400].ravel()), DIM),
        },
    )
    _parquet(
        data / "b.parquet",
        {
            "key": keys[400:700],
            "embedding": list(rows[400:700].astype(np.float64)),
            "other": np.ones(300),  # ignored
        },
    )
    _parquet(
        data / "c.parquet",
        {"key": keys[700:], **{f"embedding_{j}": rows[700:, j] for j in range(DIM)}},
    )
    config = _config(tmp_path, workers=2)
    rc, err = _import(capsys, config, "--rows", str(data), "--chunk-rows", "128")
    assert rc == 0, err
    got, unseen = _table_rows(tmp_path / "run", keys)
    assert unseen == 0 and np.array_equal(_bits(got[:, :DIM]), _bits(rows))


def test_parquet_optimizer_state_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = 200
    keys, rows, state = _keys(n), _rows(n), np.abs(_rows(n, seed=4))
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    _parquet(a, {"key": keys[:120], "embedding": list(rows[:120]), "acc": list(state[:120])})
    numbered = {f"acc_{j}": state[120:, j] for j in range(DIM)}
    _parquet(b, {"key": keys[120:], "embedding": list(rows[120:]), **numbered})
    config = _config(tmp_path)
    rc, err = _import(capsys, config, "--rows", str(a), str(b), "--state-column", "acc")
    assert rc == 0, err
    got, unseen = _table_rows(tmp_path / "run", keys)
    assert unseen == 0 and np.array_equal(_bits(got), _bits(np.concatenate([rows, state], 1)))
    # the state for some files only: which rows would start from the initial state is unclear
    other = _config(tmp_path / "other")
    _parquet(b, {"key": keys[120:], "embedding": list(rows[120:])})
    _fails(
        capsys,
        other,
        ["--rows", str(a), str(b), "--state-column", "acc"],
        f"{b}: no optimizer state column (acc)",
    )


@pytest.mark.parametrize(
    "optimizer",
    [
        {"kind": "adagrad", "initial_accumulator": 0.25},
        {"kind": "adagrad", "row_wise": True},
        {"kind": "adam"},
        {"kind": "sgd"},
    ],
)
def test_optimizer_state_given_or_initial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], optimizer: dict[str, Any]
) -> None:
    n = 600
    keys, rows = _keys(n), _rows(n)
    config = _config(tmp_path / "initial", optimizer=optimizer)
    rc, err = _import(capsys, config, *_npy_args(_save(tmp_path, keys=keys, rows=rows)))
    assert rc == 0, err
    got, _ = _table_rows(tmp_path / "initial" / "run", keys)
    spec = load_servable(tmp_path / "initial" / "run").table.spec
    width = spec.stats_at - DIM  # the optimizer state's
    expected = np.zeros((n, width), dtype=np.float32)
    if optimizer.get("initial_accumulator"):
        expected[:] = optimizer["initial_accumulator"]
    assert np.array_equal(_bits(got[:, DIM:]), _bits(expected))
    if width == 0:
        return
    state = np.abs(_rows(n, width, seed=3))
    if optimizer["kind"] == "adam":  # m may be negative; the step is an int32 count's bits
        state[:, :DIM] *= -1
        state[:, -1] = np.arange(n, dtype=np.int32).view(np.float32)
    given = _config(tmp_path / "given", optimizer=optimizer)
    paths = _save(tmp_path / "given", keys=keys, rows=rows, state=state)
    rc, err = _import(capsys, given, *_npy_args(paths))
    assert rc == 0, err
    got, _ = _table_rows(tmp_path / "given" / "run", keys)
    assert np.array_equal(_bits(got), _bits(np.concatenate([rows, state], axis=1)))


def test_the_checkpoint_holds_the_dense_model_a_new_run_starts_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from daskhps.config.runconfig import load_config

    config = _config(tmp_path)
    rc, err = _import(capsys, config, *_npy_args(_save(tmp_path, keys=_keys(10), rows=_rows(10))))
    assert rc == 0, err
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None and ckpt.passes_done == 0 and ckpt.step == 0
    fresh, _ = worker.build_dense(Trainer(load_config(config)).parts.train_setup())
    want = fresh.state_dict()
    got = ckpt.dense_state()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


# -- bad inputs: one line, nothing left behind -----------------------------------------------


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_the_progress_bar_is_drawn_on_a_terminal_only(
    terminal: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --quiet: a bar on a terminal; none where stderr is a file or a pipe (a log, in
    which its carriage returns make one endless line)."""
    stderr = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    paths = _save(tmp_path, keys=_keys(300), rows=_rows(300))
    d = tiny_config(tmp_path / "run", tmp_path / "logs", run={"quiet": False}, table={"dim": DIM})
    config = write_config(tmp_path / "run.yaml", d)
    assert main(["import", str(config), *_npy_args(paths)]) == 0
    assert ("importing" in stderr.getvalue()) == terminal, stderr.getvalue()


def test_bad_npy_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n = 50
    keys, rows = _keys(n), _rows(n)
    config = _config(tmp_path, workers=2)
    good = _save(tmp_path, keys=keys, rows=rows)
    wide = _save(tmp_path, rows5=_rows(n, DIM + 1))["rows5"]
    _fails(capsys, config, ["--keys", good["keys"], "--rows", wide], "rows5.npy row 0", "5 floats")
    nan = rows.copy()
    nan[17, 2] = np.nan
    bad = _save(tmp_path, nan=nan)["nan"]
    _fails(
        capsys, config, ["--keys", good["keys"], "--rows", bad], "nan.npy row 17", "nan (column 2)"
    )
    dup = keys.copy()
    dup[30] = dup[4]
    dupf = _save(tmp_path, dup=dup)["dup"]
    _fails(
        capsys,
        config,
        ["--keys", dupf, "--rows", good["rows"]],
        f"duplicate key {keys[4]}",
        "dup.npy row 4 and",
        "dup.npy row 30",
    )
    # across chunks: rows 4 and 30 are in the first and the fourth chunk of 8 rows
    _fails(
        capsys,
        config,
        ["--keys", dupf, "--rows", good["rows"], "--chunk-rows", "8"],
        f"duplicate key {keys[4]}: {dupf} row 4 and {dupf} row 30",
    )
    missing = str(tmp_path / "nope.npy")
    _fails(capsys, config, ["--keys", missing, "--rows", good["rows"]], missing, "no such file")
    short = _save(tmp_path, short=keys[:-1])["short"]
    _fails(capsys, config, ["--keys", short, "--rows", good["rows"]], "50 rows", "49 keys")
    state = _save(tmp_path, state=np.zeros((n, DIM + 1), np.float32))["state"]
    _fails(capsys, config, [*_npy_args(good), "--state", state], "state.npy row 0", "5 floats")
    neg = np.zeros((n, DIM), np.float32)
    neg[9, 1] = -1
    negf = _save(tmp_path, neg=neg)["neg"]
    _fails(
        capsys,
        config,
        [*_npy_args(good), "--state", negf],
        "neg.npy row 9",
        "Adagrad accumulator (state column 1) is -1.0",
    )
    huge = rows.astype(np.float64)
    huge[11, 3] = 1e300  # beyond float32: an infinity once rounded to the table's type
    hugef = _save(tmp_path, huge=huge)["huge"]
    _fails(capsys, config, ["--keys", good["keys"], "--rows", hugef], "huge.npy row 11", "inf")
    ints = _save(tmp_path, ints=keys.astype(np.int32))["ints"]
    _fails(capsys, config, ["--keys", ints, "--rows", good["rows"]], "ints.npy", "int64")
    _fails(capsys, config, ["--rows", good["rows"]], "--keys")
    assert not (tmp_path / "run").exists()


def test_bad_parquet_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n = 40
    keys, rows = _keys(n), _rows(n)
    config = _config(tmp_path, workers=2)
    f = tmp_path / "wrong.parquet"
    _parquet(f, {"id": keys, "embedding": list(rows)})
    _fails(capsys, config, ["--rows", str(f)], str(f), "no key column 'key'", "--key-column")
    _parquet(f, {"key": keys, "emb": list(rows)})
    _fails(capsys, config, ["--rows", str(f)], "no column 'embedding'", "columns: key, emb")
    _parquet(f, {"key": keys.astype(str), "embedding": list(rows)})
    _fails(capsys, config, ["--rows", str(f)], "key column 'key' is string")
    _parquet(f, {"key": keys, "embedding": [f"{x}" for x in range(n)]})
    _fails(capsys, config, ["--rows", str(f)], "column 'embedding' is string")
    ragged = [list(r) for r in rows]
    ragged[33] = ragged[33][:3]
    _parquet(f, {"key": keys, "embedding": ragged})
    _fails(capsys, config, ["--rows", str(f)], f"{f} row 33", "holds 3 floats")
    inf = rows.copy()
    inf[21, 0] = np.inf
    _parquet(f, {"key": keys, **{f"embedding_{j}": inf[:, j] for j in range(DIM)}})
    _fails(capsys, config, ["--rows", str(f)], f"{f} row 21", "inf (column 0)")
    _parquet(f, {"key": keys, **{f"embedding_{j}": rows[:, j % DIM] for j in range(DIM + 1)}})
    _fails(capsys, config, ["--rows", str(f)], f"{f} row 0", "5 floats")
    # the same key in two files
    g = tmp_path / "other.parquet"
    _parquet(f, {"key": keys, "embedding": list(rows)})
    _parquet(g, {"key": keys[-1:], "embedding": list(rows[:1])})
    _fails(
        capsys,
        config,
        ["--rows", str(f), str(g)],
        f"duplicate key {keys[-1]}: {f} row {n - 1} and {g} row 0",
    )
    _fails(capsys, config, ["--rows", str(tmp_path / "none-*.parquet")], "matches no file")
    assert not (tmp_path / "run").exists()


def test_a_cluster_address_needs_workers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tiny_config(tmp_path / "run", tmp_path / "logs")
    d["cluster"] = {"address": "tcp://127.0.0.1:1", "gpu": False}
    config = write_config(tmp_path / "run.yaml", d)
    paths = _save(tmp_path, keys=_keys(40), rows=_rows(40))
    _fails(capsys, config, _npy_args(paths), "cluster.address", "--workers N")
    rc, err = _import(capsys, config, *_npy_args(paths), "--workers", "3")
    assert rc == 0, err
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None and ckpt.num_workers == 3
    assert _table_rows(tmp_path / "run", _keys(40))[1] == 0


def test_an_existing_run_is_refused_and_overwrite_replaces_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = 300
    keys = _keys(n)
    config = _config(tmp_path, workers=2)
    first = _save(tmp_path, keys=keys, rows=_rows(n))
    assert _import(capsys, config, *_npy_args(first))[0] == 0
    more = _save(tmp_path, keys2=keys[:100], rows2=_rows(100, seed=9))
    second = {"keys": more["keys2"], "rows": more["rows2"]}
    _fails(capsys, config, _npy_args(second), "already holds a run", "--overwrite")
    # --overwrite with a bad input: the earlier run stays as it was
    dup = keys[:100].copy()
    dup[99] = dup[0]
    dupf = _save(tmp_path, dup=dup)["dup"]
    _fails(
        capsys,
        config,
        ["--keys", dupf, "--rows", second["rows"], "--overwrite", "--chunk-rows", "16"],
        "duplicate key",
    )
    assert _import(capsys, config, *_npy_args(second), "--overwrite")[0] == 0
    got, unseen = _table_rows(tmp_path / "run", keys[:100])
    assert unseen == 0 and np.array_equal(_bits(got[:, :DIM]), _bits(_rows(100, seed=9)))
    assert _table_rows(tmp_path / "run", keys[100:])[1] == n - 100  # the earlier rows are gone
    assert [c.name for c in list_checkpoints(tmp_path / "run")] == ["pass-000000"]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "checkpoints",
        "config.yaml",
        "stores",
    ]


# -- training on top of an import ------------------------------------------------------------


@pytest.mark.slow
def test_train_resumes_from_the_imported_rows(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    shared_clusters: SharedClusters,
) -> None:
    """A run trained from scratch initialises every row of its first pass; the same run after
    importing that run's exported rows stages every one of them from the stores instead.
    Both train in this process on the session's warm clusters (tests/_clusters.py): one worker
    from scratch, two on top of the import."""
    import json

    from daskhps.config.runconfig import load_config
    from tests._logs import generated_logs

    logs = generated_logs(tmp_path_factory, days=1, rows_per_day=600, parts_per_day=1, seed=3)
    tmp = tmp_path_factory.mktemp("import-train")

    def config(name: str, workers: int) -> Path:
        d = tiny_config(tmp / name, logs)
        d["cluster"] = shared_clusters.section(workers=workers, threads=1)
        return write_config(tmp / f"{name}.yaml", d)

    def first_pass(run_dir: Path) -> dict[str, Any]:
        return dict(json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0]))

    scratch = config("scratch", 1)
    Trainer(load_config(str(scratch)), progress=False).run()
    fresh = first_pass(tmp / "scratch")
    assert fresh["staged_from"]["init"] == fresh["rows_staged"] > 0

    exported = export_model(load_servable(tmp / "scratch"), tmp / "export")
    imported = config("imported", 2)
    keys_npy, rows_npy = tmp / "export" / "keys.npy", tmp / "export" / "embeddings.npy"
    args = ["--keys", str(keys_npy), "--rows", str(rows_npy), "--workers", "2"]  # 2 rank stores
    rc = main(["import", str(imported), *args])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert f"daskhps train {imported} --resume" in out.out
    keys = np.load(keys_npy)
    before, unseen = _table_rows(tmp / "imported", keys)
    assert unseen == 0 and exported.keys == len(keys)

    Trainer(load_config(str(imported)), progress=False).run(resume=True)
    on_top = first_pass(tmp / "imported")
    assert on_top["rows_staged"] == fresh["rows_staged"]
    assert on_top["staged_from"]["init"] == 0
    assert on_top["staged_from"]["store"] == on_top["rows_staged"]
    after, _ = _table_rows(tmp / "imported", keys, trained=True)
    assert not np.array_equal(after[:, :DIM], before[:, :DIM])  # and it trained them


# -- memory: bounded by the chunk and the stores' key index, not by the input ---------------


@pytest.mark.slow
def test_memory_does_not_grow_with_the_input(tmp_path: Path) -> None:
    """The same import of 70,000 and of 280,000 wide rows (dim 256, 1 KiB each): the process's
    peak resident memory grows by less than half the extra input (205 MiB). Reading the input
    whole, or through memory maps that keep every page read resident, would grow it by more
    than the extra input; what grows is the stores' key index (tens of bytes per key)."""
    from daskhps.capacity.measured import start_sampling, stop_sampling
    from daskhps.config.runconfig import load_config
    from daskhps.importing import import_table, open_source

    dim = 256

    def growth(name: str, n: int) -> int:
        folder = tmp_path / name
        folder.mkdir()
        paths = _save(folder, keys=_keys(n), rows=_rows(n, dim))
        d = tiny_config(
            folder / "run",
            tmp_path / "logs",
            table={"dim": dim, "optimizer": {"kind": "sgd"}},
            cluster={"n_workers": 1},
        )
        config = load_config(str(write_config(folder / "run.yaml", d)))
        source = open_source(config.table_spec(), [paths["rows"]], keys=paths["keys"])
        base = start_sampling()
        try:
            import_table(config, source, progress=False, chunk_rows=4096)
        finally:
            peak = stop_sampling()
        return peak - base

    growth("warm-up", 5000)  # torch's first optimizer, the stores' code paths
    small, large = growth("small", 70_000), growth("large", 280_000)
    extra_input = (280_000 - 70_000) * dim * 4
    assert large - small < extra_input / 2, (small >> 20, large >> 20, extra_input >> 20)

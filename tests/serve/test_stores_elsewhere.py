"""``inspect``, ``predict``, ``export`` and ``serve`` on a run whose stores are on other machines'
disks (daskhps/runfiles/reading.py).

A real 2-worker run trains once for the module with ``checkpoint.replicate_to`` set. Each test
takes its own copy of the run folder (its checkpoints read the stores beside them) and makes
this machine one that does not hold the stores: the stores folder moved away, or rank 0's store
replaced by one whose commit of the checkpoint's name is another (another run's rows). Every
command then gives the answers of the original, read from the copy; without a usable copy each
prints one line and exits 1, changing nothing on disk. On the machine that holds the stores the
copy is never read.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from daskhps.cli import main
from daskhps.config import RunConfig
from daskhps.retrain.versions import Registry
from daskhps.runfiles.checkpoint import MANIFEST, latest_checkpoint, list_checkpoints
from daskhps.runfiles.copycache import CopyCache
from daskhps.runfiles.replica import Replica
from daskhps.serve import load_servable
from daskhps.serve.export import EMBEDDINGS, KEYS
from daskhps.serve.score import CacheSizes, Scorer
from daskhps.serve.server import ServeOptions
from daskhps.table import open_shard_store
from daskhps.training.inspection import describe
from daskhps.training.trainer import Trainer
from tests._clusters import SharedClusters
from tests._logs import generated_logs
from tests._runs import tiny_config
from tests._signals import default_dispositions
from tests.serve.helpers import Running, publish_checkpoint, tree_state

pytestmark = pytest.mark.slow

NAMES = ["pass-000001", "pass-000002"]


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory, shared_clusters: SharedClusters
) -> dict[str, Any]:
    """A 2-worker run, two checkpoints, each copied to ``checkpoint.replicate_to``."""
    logs = generated_logs(
        tmp_path_factory, days=2, rows_per_day=2000, parts_per_day=1, seed=4, name="elsewhere"
    )
    root = tmp_path_factory.mktemp("elsewhere-run")
    d = tiny_config(
        root / "run",
        logs,
        data={"holdout": {"day": "last"}},
        passes={"examples_per_pass": 1000},
        checkpoint={"replicate_to": f"file://{root / 'copy'}"},
        cluster_section=shared_clusters.section(workers=2, threads=1),
    )
    cfg = RunConfig.from_dict(d, source="test")
    Trainer(cfg, progress=False).run()
    assert [c.name for c in list_checkpoints(cfg.run.dir)] == NAMES
    assert [c.name for c in list_checkpoints(root / "copy")] == NAMES
    return {
        "run": Path(cfg.run.dir),
        "copy": root / "copy",
        "holdout": sorted(str(p) for p in logs.glob("day=*02/part-*")),
        "scheduler": shared_clusters.address(workers=1, threads=2),
    }


def _never(*_: Any) -> Any:
    raise AssertionError("the copy was read")


def _answers(model: Path, out: Path, trained: dict[str, Any]) -> dict[str, Any]:
    """What each command gives for ``model``: inspect's description, predict's probabilities,
    export's keys and rows, and a served answer to the holdout's lines."""
    data = ["--data", *trained["holdout"]]
    pred = ["predict", "--model", str(model), *data, "--out", str(out / "pred")]
    assert main([*pred, "--scheduler", trained["scheduler"]]) == 0
    parts = sorted((out / "pred").glob("part-*.parquet"))
    probs = pd.concat([pd.read_parquet(p) for p in parts])["probability"].to_numpy()
    assert main(["export", "--model", str(model), "--out", str(out / "export")]) == 0
    served = Running(ServeOptions(model=str(model), device_rows=2000, host_bytes=1 << 20))
    try:
        answer = served.client.predict_lines(Path(trained["holdout"][0]).read_text())
    finally:
        served.close()
    return {
        "inspect": describe(model),
        "predict": probs,
        "keys": np.load(out / "export" / KEYS),
        "embeddings": np.load(out / "export" / EMBEDDINGS),
        "serve": np.array(answer.probabilities),
    }


@pytest.fixture(scope="module")
def original(trained: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every command's answers on the machine that holds the stores; the copy is never read
    (reading it fails)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Replica, "local_checkpoint", _never)
        return _answers(trained["run"], tmp_path_factory.mktemp("original"), trained)


@pytest.fixture
def run(trained: dict[str, Any], tmp_path: Path) -> Path:
    """This test's copy of the run folder; its checkpoints read the stores beside them."""
    shutil.copytree(trained["run"], tmp_path / "run")
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None and ckpt.stores_dir == tmp_path / "run" / "stores"
    return tmp_path / "run"


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert np.array_equal(got["predict"], want["predict"])
    assert np.array_equal(got["keys"], want["keys"])
    assert np.array_equal(got["embeddings"], want["embeddings"])
    assert np.array_equal(got["serve"], want["serve"])
    for a, b in zip(got["inspect"]["checkpoints"], want["inspect"]["checkpoints"], strict=True):
        assert a["name"] == b["name"] and a["rows"] == b["rows"] > 0
        assert [s["store_rows"] for s in a["shards"]] == [s["store_rows"] for s in b["shards"]]
    assert not got["inspect"]["damaged"]


def test_on_the_machine_that_holds_the_stores_the_copy_is_never_read(
    original: dict[str, Any], trained: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    info = original["inspect"]
    assert [c["name"] for c in info["checkpoints"]] == NAMES and not info["damaged"]
    assert all(c["read_from_copy"] is None for c in info["checkpoints"])
    assert len(original["keys"]) == info["checkpoints"][-1]["rows"]
    assert len(original["predict"]) > 1000
    assert np.abs(original["serve"] - original["predict"][: len(original["serve"])]).max() < 1e-6
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Replica, "local_checkpoint", _never)
        assert main(["inspect", str(trained["run"])]) == 0
        assert "read from the copy" not in capsys.readouterr().out
        s = load_servable(trained["run"])
    assert s.table.stores_dir == trained["run"] / "stores"


def _segment_chunk(stores: Path, commit: str) -> Path:
    """The first rows chunk file of the newest segment that ``commit`` of rank 0 reads."""
    store = stores / "embeddings" / "rank-0"
    for f in (store / "commits").glob("*.json"):
        m = json.loads(f.read_text())
        if m["name"] == commit:
            return store / "segments" / f"{max(m['segments']):010d}" / "rows" / "c" / "0" / "0"
    raise AssertionError(f"no commit {commit} in {store}")


def test_stores_moved_away_are_read_from_the_copy(
    run: Path,
    tmp_path: Path,
    trained: dict[str, Any],
    original: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    shutil.move(run / "stores", tmp_path / "on-the-workers")  # not on this machine
    got = _answers(run, tmp_path / "out", trained)
    _same(got, original)
    copy = trained["copy"]
    for c in got["inspect"]["checkpoints"]:
        read = c["read_from_copy"]
        assert read["checkpoint"] == str(copy / "checkpoints" / c["name"])
        assert read["stores_dir"] == str(copy / "stores" / "stores")
        assert read["why"].startswith(f"not on this machine (no store at {run / 'stores'}/")
    assert "its rows are read from the copy at" in caplog.text  # predict, export, serve say so

    capsys.readouterr()
    assert main(["inspect", str(run)]) == 0
    out = capsys.readouterr().out
    line = f"  stores: read from the copy at {copy / 'checkpoints' / 'pass-000002'}: not on this"
    assert line in out and "DAMAGED" not in out, out
    # --verify verifies the copy: a changed byte there (same size) is found by it alone
    chunk = _segment_chunk(copy / "stores" / "stores", "pass-000002")
    data = chunk.read_bytes()
    chunk.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    try:
        assert main(["inspect", str(run)]) == 0
        assert main(["inspect", str(run), "--verify"]) == 3
        out = capsys.readouterr().out
        assert f"DAMAGED rank 0: chunk file {chunk} does not match the sha256" in out, out
    finally:
        chunk.write_bytes(data)
    assert main(["inspect", str(run), "--verify", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["verified"] and not info["damaged"]
    # a stale partial folder at a store's path (no metadata, no commit) is not the store
    partial = run / "stores" / "embeddings" / "rank-0"
    (partial / "segments").mkdir(parents=True)
    (partial / "segments" / "leftover").write_bytes(b"x" * 10)
    last = describe(run)["checkpoints"][-1]
    assert last["read_from_copy"]["why"].startswith(
        f"not on this machine: the store at {partial} holds other rows (store metadata "
    )
    assert not last["damage"] and last["rows"] == original["inspect"]["checkpoints"][-1]["rows"]


def _another_runs_commit(run: Path) -> None:
    """Rank 0's store of the newest checkpoint: its rows changed and committed again under
    the checkpoint's name, as another run writing a store at that path does."""
    ckpt = latest_checkpoint(run)
    assert ckpt is not None
    with open_shard_store(ckpt.table_spec, ckpt.store_path(0), mode="a") as store:
        keys = store.keys()
        store.upsert(keys, store.lookup(keys).rows + 1.0)
        store.commit(ckpt.commit, {"checkpoint": "another run's"})


def test_another_runs_store_at_the_path_is_not_read(
    run: Path, tmp_path: Path, trained: dict[str, Any], original: dict[str, Any]
) -> None:
    _another_runs_commit(run)
    got = _answers(run, tmp_path / "out", trained)
    _same(got, original)
    first, last = got["inspect"]["checkpoints"]
    assert first["read_from_copy"] is None  # its commit there is still its own
    why = last["read_from_copy"]["why"]
    assert why.startswith(f"not on this machine: the store at {run / 'stores'}/embeddings/rank-0")
    assert "holds other rows (its commit 'pass-000002' is seq" in why
    assert "a stale copy or another run's store" in why
    # the rows there are not the checkpoint's: read, they would give other answers
    ckpt = latest_checkpoint(run)
    assert ckpt is not None
    with ckpt.open_store(0) as store:
        keys = store.keys()
        there = store.lookup(keys).rows
    with list_checkpoints(trained["copy"])[-1].open_store(0) as store:
        assert not np.array_equal(there.numpy(), store.lookup(keys).rows.numpy())


def _without_copy(run: Path, replicate_to: str | None) -> None:
    """The run's checkpoints as a run with ``checkpoint.replicate_to`` set so (None: none)."""
    for manifest in run.glob(f"checkpoints/*/{MANIFEST}"):
        m = json.loads(manifest.read_text())
        m["config"]["checkpoint"]["replicate_to"] = replicate_to
        manifest.write_text(json.dumps(m, indent=1))


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(args) == 1, args
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("case", ["moved, no copy", "moved, not in the copy", "another's rows"])
def test_without_a_usable_copy_each_command_is_one_line_and_changes_nothing(
    run: Path,
    tmp_path: Path,
    trained: dict[str, Any],
    case: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stores = run / "stores" / "embeddings"
    if case == "another's rows":
        _another_runs_commit(run)
        _without_copy(run, None)
        where = f"the store at {stores}/rank-0 holds other rows"
    else:
        shutil.move(run / "stores", tmp_path / "on-the-workers")
        where = f"not on this machine (no store at {stores}/rank-0): on the disks of the "
        where += "workers that trained it, or moved or deleted; "
    if case == "moved, not in the copy":
        (tmp_path / "empty-copy").mkdir()
        _without_copy(run, str(tmp_path / "empty-copy"))
        give = f"its copy at {tmp_path / 'empty-copy'} has no checkpoint pass-00000"
    else:
        _without_copy(run, None)
        give = "set checkpoint.replicate_to for the run (its checkpoints are copied there, and "
    before = {**tree_state(tmp_path), **tree_state(trained["copy"])}
    out = tmp_path / "out"
    pred = ["predict", "--model", str(run), "--data", trained["holdout"][0]]
    lines = [
        _refused(["inspect", str(run)], capsys),
        _refused(["export", "--model", str(run), "--out", str(out / "export")], capsys),
        _refused([*pred, "--out", str(out / "pred"), "--scheduler", trained["scheduler"]], capsys),
    ]
    served = subprocess.run(
        [sys.executable, "-m", "daskhps.cli", "serve", "--model", str(run), "--port", "0"],
        capture_output=True, text=True, timeout=120, preexec_fn=default_dispositions,
    )  # fmt: skip
    assert served.returncode == 1, served.stderr
    errors = [x for x in served.stderr.splitlines() if x.strip()]
    assert len(errors) == 1 and "Traceback" not in served.stderr, served.stderr
    lines.append(served.stderr)
    for line, command in zip(lines, ["inspect", "export", "predict", "serve"], strict=True):
        assert line.startswith(f"daskhps {command}: error: "), line
        assert f"checkpoint {run / 'checkpoints' / 'pass-0000'}" in line, line
        assert where in line and give in line, line
        assert line.rstrip().endswith("run this on a machine that holds the stores"), line
    assert {**tree_state(tmp_path), **tree_state(trained["copy"])} == before
    assert not out.exists()


def _registry(run: Path, tmp_path: Path) -> Registry:
    """A retraining run's registry of ``run``'s two checkpoints, v000001 current."""
    reg = Registry(tmp_path / "retrain" / "versions")
    ckpts = list_checkpoints(run)
    publish_checkpoint(reg, "v000001", ckpts[0])
    publish_checkpoint(reg, "v000002", ckpts[1])
    reg.rollback("v000001")
    return reg


@pytest.fixture
def versions(run: Path, tmp_path: Path) -> Iterator[Registry]:
    """A retraining run's registry of this run's two checkpoints (v000001 current), then
    the stores moved away: the versions' rows are read from their candidates' copies."""
    yield _registry(run, tmp_path)


def _scores(model: Path, frame: pd.DataFrame) -> np.ndarray:
    scorer = Scorer(load_servable(model), CacheSizes(device_rows=100_000, host_bytes=0))
    try:
        return scorer.score(frame)
    finally:
        scorer.close()


def _follows(
    versions: Registry, run: Path, tmp_path: Path, trained: dict[str, Any], copy_stores: Path
) -> None:
    """Each version's scores from its own stores; then the stores moved away, ``serve`` of the
    retraining run answers with v000001's rows from the copy (at ``copy_stores``), and after a
    rollback to v000002, follows it."""
    from daskhps.data.readers import read_click_log

    folder = versions.folder
    s = load_servable(folder / "v000001")
    frame = read_click_log(trained["holdout"], schema=s.config.data.schema).frame.compute()
    frame = frame.reset_index(drop=True)
    refs = {v: _scores(folder / v, frame) for v in ("v000001", "v000002")}  # their own stores
    assert np.abs(refs["v000001"] - refs["v000002"]).max() > 1e-4
    shutil.move(run / "stores", tmp_path / "on-the-workers")
    copied = load_servable(folder.parent)
    assert copied.name == "v000001"
    assert copied.table.stores_dir == copy_stores
    text = Path(trained["holdout"][0]).read_text()
    n = len(text.splitlines())
    served = Running(ServeOptions(model=str(folder.parent), device_rows=500, poll_s=3600))
    try:
        first = served.client.predict_lines(text)
        assert first.version == "v000001"
        assert np.abs(np.array(first.probabilities) - refs["v000001"][:n]).max() < 1e-6
        versions.rollback("v000002")
        swap = served.refresh()
        assert (swap.old, swap.new) == ("v000001", "v000002")
        second = served.client.predict_lines(text)
    finally:
        served.close()
    assert second.version == "v000002"
    assert np.abs(np.array(second.probabilities) - refs["v000002"][:n]).max() < 1e-6


def test_serve_follows_versions_whose_stores_are_elsewhere(
    run: Path, tmp_path: Path, versions: Registry, trained: dict[str, Any]
) -> None:
    _follows(versions, run, tmp_path, trained, trained["copy"] / "stores" / "stores")


# -- the copy in object storage (an S3-compatible server on 127.0.0.1) --------------------


@pytest.fixture(scope="module")
def s3_copy(trained: dict[str, Any]) -> Iterator[str]:
    """The run's copy as ``checkpoint.replicate_to: s3://...`` holds it (the same files, in
    a bucket of the server), read by this process through s3fs."""
    from daskhps import storage
    from tests._s3 import s3_server

    with s3_server() as server:
        storage.use_options(server.options)
        try:
            yield server.upload(trained["copy"], server.bucket("copies") + "/run")
        finally:
            storage.use_options({"s3": {}})


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's local cache of copies, empty."""
    monkeypatch.setenv("DASKHPS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_copy_in_object_storage_is_read_through_the_local_cache(
    s3_copy: str,
    cache: Path,
    tmp_path: Path,
    trained: dict[str, Any],
    original: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level("INFO", logger="daskhps.runfiles.copycache")
    got = _answers(s3_copy, tmp_path / "out", trained)  # type: ignore[arg-type]
    # Its newest checkpoint, pass-000002: the original's answers bit for bit.
    (inspected,) = got["inspect"]["checkpoints"]
    want = original["inspect"]["checkpoints"][-1]
    assert inspected["name"] == want["name"] == NAMES[-1]
    assert inspected["rows"] == want["rows"] > 0 and not got["inspect"]["damaged"]
    _same({**got, "inspect": original["inspect"]}, original)
    fetches = [r.getMessage() for r in caplog.records if "through the local cache" in r.message]
    assert fetches and all(
        f.startswith(f"read {s3_copy}/checkpoints/pass-000002 ") for f in fetches
    )
    # Read again: only the manifest is fetched again (the store files are in the cache).
    assert len(fetches) >= 3 and all(" fetched 1 file(s), " in f for f in fetches[1:])
    (mirror,) = (cache / "copies").iterdir()
    assert (mirror / "checkpoints" / "pass-000002" / MANIFEST).is_file()
    # A limit below what the checkpoint needs: one line, before anything is fetched.
    monkeypatch.setenv("DASKHPS_CACHE_DIR", str(tmp_path / "small-cache"))
    monkeypatch.setenv("DASKHPS_CACHE_SIZE", "1KiB")
    capsys.readouterr()
    assert main(["inspect", s3_copy]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"daskhps inspect: error: {s3_copy}/checkpoints/pass-000002 needs ")
    assert "more than its limit of 1.0 KiB: raise DASKHPS_CACHE_SIZE" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "small-cache" / "copies").exists() or not any(
        (tmp_path / "small-cache" / "copies").rglob("*.json")
    )


def test_serve_follows_versions_whose_copy_is_in_object_storage(
    run: Path, tmp_path: Path, s3_copy: str, cache: Path, trained: dict[str, Any]
) -> None:
    _without_copy(run, s3_copy)  # the run copied its checkpoints to the bucket
    mirror = CopyCache().folder(s3_copy)
    _follows(_registry(run, tmp_path), run, tmp_path, trained, mirror / "stores" / "stores")


def test_predict_reads_the_model_and_the_logs_from_the_bucket_with_fsspec_environment(
    s3_copy: str, cache: Path, tmp_path: Path, trained: dict[str, Any], original: dict[str, Any]
) -> None:
    """A fresh ``daskhps predict`` process and its embedded cluster's workers, told how to
    reach the store by fsspec's environment variables alone (no config), read the model's
    copy and the logs from the bucket."""
    import fsspec

    from tests._runs import cli

    fs = fsspec.filesystem("s3")  # the options the s3_copy fixture set in this process
    for f in trained["holdout"]:
        fs.put_file(f, f"copies/holdout/{Path(f).name}")
    env = {f"FSSPEC_S3_{k.upper()}": str(v) for k, v in fsspec.config.conf["s3"].items()}
    with pytest.MonkeyPatch.context() as mp:
        for k in ("endpoint_url", "key", "secret"):
            mp.setenv(f"FSSPEC_S3_{k.upper()}", env[f"FSSPEC_S3_{k.upper()}"])
        out = tmp_path / "pred"
        got = cli("predict", "--model", s3_copy, "--data", "s3://copies/holdout/*",
                  "--out", str(out), "--workers", "1", timeout=300)  # fmt: skip
    assert got.returncode == 0, got.stderr
    probs = pd.concat([pd.read_parquet(p) for p in sorted(out.glob("part-*.parquet"))])
    assert np.array_equal(probs["probability"].to_numpy(), original["predict"])
    assert all(f.startswith("s3://copies/holdout/") for f in probs["file"].unique())

"""Damaged checkpoints and store segments of a real run folder are found and named.

One small run (1 worker, 3 passes, a checkpoint after each) is trained once for the module, on
the session's warm shared cluster (tests/_clusters.py); each test damages its own copy (the
manifests' ``stores_dir`` pointed at the copy's stores) and checks what ``daskhps inspect``,
``latest_checkpoint``, ``predict`` and ``export`` say.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from daskhps.cli import main
from daskhps.config import RunConfig
from daskhps.runfiles.checkpoint import DENSE, MANIFEST, latest_checkpoint, scan_checkpoints
from daskhps.serve.export import META
from daskhps.serve.predict import SUMMARY
from daskhps.training.trainer import Trainer
from tests._clusters import WORKER_MEMORY, SharedClusters
from tests._logs import generated_logs
from tests._runs import tiny_config

pytestmark = pytest.mark.slow

NAMES = ["pass-000001", "pass-000002", "pass-000003"]


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory, shared_clusters: SharedClusters
) -> dict[str, Any]:
    logs = generated_logs(tmp_path_factory, days=2, rows_per_day=600, parts_per_day=1, seed=5)
    root = tmp_path_factory.mktemp("damaged-run")
    d = tiny_config(
        root / "run",
        logs,
        data={"holdout": {"day": "last"}},
        passes={"examples_per_pass": 200},
        checkpoint={"every_passes": 1, "keep": 5},
    )
    d["cluster"] = shared_clusters.section(workers=1, threads=2)
    cfg = RunConfig.from_dict(d, source="test")
    Trainer(cfg, progress=False).run()
    assert [c.name for c in scan_checkpoints(cfg.run.dir)[0]] == NAMES
    return {
        "run": Path(cfg.run.dir),
        "holdout": sorted(str(p) for p in logs.glob("day=*02/part-*")),
    }


@pytest.fixture
def run(trained: dict[str, Any], tmp_path: Path) -> Path:
    """A copy of the trained run whose checkpoints read the copy's stores."""
    copy = tmp_path / "run"
    shutil.copytree(trained["run"], copy)
    for manifest in copy.glob(f"checkpoints/*/{MANIFEST}"):
        m = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**m, "stores_dir": str(copy / "stores")}, indent=1))
    return copy


def _inspect(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(["inspect", *args])
    return status, capsys.readouterr().out


def _newest_segment_chunk(run: Path) -> Path:
    """The first rows chunk file of a segment that only pass-000003's commit reads."""
    store = run / "stores" / "embeddings" / "rank-0"
    commits = {}
    for f in (store / "commits").glob("*.json"):
        m = json.loads(f.read_text())
        commits[m["name"]] = set(m["segments"])
    only = sorted(commits["pass-000003"] - commits["pass-000002"])
    assert only, commits
    return store / "segments" / f"{only[-1]:010d}" / "rows" / "c" / "0" / "0"


def test_an_intact_run_inspects_clean(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = _inspect(capsys, str(run), "--verify")
    assert status == 0, out
    assert "DAMAGED" not in out and "damaged" not in out
    assert "sizes and sha256" in out and "no checksum" not in out


def test_truncated_dense_is_named_by_latest_and_inspect(
    run: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    dense = run / "checkpoints" / "pass-000003" / DENSE
    size = dense.stat().st_size
    dense.write_bytes(dense.read_bytes()[:1234])
    reason = f"dense.pt is 1234 bytes, the manifest says {size}"
    with caplog.at_level("WARNING", logger="daskhps.runfiles.checkpoint"):
        latest = latest_checkpoint(run)  # what --resume and predict take
    assert latest is not None and latest.name == "pass-000002"
    assert [r.getMessage() for r in caplog.records] == [
        f"skipping checkpoint pass-000003: {reason} (damaged; never loaded)"
    ]
    status, out = _inspect(capsys, str(run))
    assert status == 3
    assert f"pass-000003: damaged, never loaded: {reason}" in out
    assert "incomplete" not in out  # the manifest is intact: the file is what is damaged
    status, out = _inspect(capsys, str(run / "checkpoints" / "pass-000003"), "--json")
    info = json.loads(out)
    assert status == 3 and info["damaged"] and info["checkpoints"] == []
    assert info["skipped"][0]["kind"] == "damaged" and info["skipped"][0]["reason"] == reason
    assert info["damage"] == [f"pass-000003: {reason}"]


def test_truncated_segment_is_caught_by_inspect(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chunk = _newest_segment_chunk(run)
    size = chunk.stat().st_size
    chunk.write_bytes(chunk.read_bytes()[:1000])
    status, out = _inspect(capsys, str(run))
    assert status == 3
    line = f"DAMAGED rank 0: chunk file {chunk} has 1000 bytes, expected {size} (truncated)"
    assert out.count(line) == 1  # pass-000003 only: the earlier commits do not read it
    assert out.index(line) > out.index("pass-000003 (")
    status, out = _inspect(capsys, str(run), "--json")
    info = json.loads(out)
    assert [c["name"] for c in info["checkpoints"] if c["damage"]] == ["pass-000003"]
    assert info["checkpoints"][-1]["shards"][0]["store_rows"] is None


def test_changed_byte_in_a_segment_is_caught_by_verify_only(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chunk = _newest_segment_chunk(run)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))
    status, out = _inspect(capsys, str(run))
    assert status == 0 and "DAMAGED" not in out  # same size: a size check cannot tell
    status, out = _inspect(capsys, str(run), "--verify")
    assert status == 3
    assert f"DAMAGED rank 0: chunk file {chunk} does not match the sha256" in out


def test_stores_without_checksums_still_open_and_inspect(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stores written before checksums were recorded: arrays with empty attributes."""
    for meta in (run / "stores").glob("embeddings/rank-0/*/*/*/zarr.json"):
        d = json.loads(meta.read_text())
        d["attributes"] = {}
        meta.write_text(json.dumps(d))
    status, out = _inspect(capsys, str(run), "--verify", "--json")
    info = json.loads(out)
    assert status == 0 and not info["damaged"]
    assert all(c["without_checksum"] > 0 for c in info["checkpoints"])
    status, out = _inspect(capsys, str(run))
    assert status == 0 and "have no checksum (written before daskhps recorded them)" in out
    assert main(["export", "--model", str(run), "--out", str(tmp_path / "export")]) == 0


def test_predict_and_export_take_the_named_checkpoint(
    run: Path,
    trained: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shared_clusters: SharedClusters,
) -> None:
    out = tmp_path / "pred"
    data = ["--data", trained["holdout"][0]]
    args = ["predict", "--model", str(run), "--checkpoint", "pass-000002", *data]
    scheduler = shared_clusters.address(workers=1, threads=2)
    assert main([*args, "--out", str(out), "--scheduler", scheduler]) == 0
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["model"] == summary["commit"] == "pass-000002"
    assert (
        main(["export", "--model", str(run), "--checkpoint", "1", "--out", str(tmp_path / "e")])
        == 0
    )
    assert json.loads((tmp_path / "e" / META).read_text())["commit"] == "pass-000001"
    capsys.readouterr()


def test_bad_checkpoint_names_and_damaged_stores_are_one_line(
    run: Path, trained: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = ["--data", trained["holdout"][0], "--out", str(tmp_path / "pred")]

    def fails(*args: str) -> str:
        assert main(["predict", "--model", *args, *data]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        return err

    err = fails(str(run), "--checkpoint", "pass-000042")
    assert err == (
        f"daskhps predict: error: run directory {run} has no checkpoint 'pass-000042'; "
        f"valid checkpoints: {', '.join(NAMES)}\n"
    )
    err = fails(str(run / "checkpoints" / "pass-000001"), "--checkpoint", "pass-000002")
    assert "is a checkpoint folder" in err and "leave the name out" in err
    dense = run / "checkpoints" / "pass-000002" / DENSE
    dense.write_bytes(dense.read_bytes()[:99])
    err = fails(str(run), "--checkpoint", "pass-000002")
    assert "checkpoint pass-000002 of" in err and "dense.pt is 99 bytes" in err
    assert "valid checkpoints: pass-000001, pass-000003" in err
    # damaged stores: refused before a cluster starts, naming the file and the option to use
    chunk = _newest_segment_chunk(run)
    chunk.write_bytes(chunk.read_bytes()[:10])
    err = fails(str(run))
    assert str(chunk) in err and "--checkpoint NAME" in err and "commit=" not in err


def test_resume_onto_damaged_stores_stops_before_any_worker(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chunk = _newest_segment_chunk(run)
    chunk.write_bytes(chunk.read_bytes()[:1000])
    before = sorted((p, p.stat().st_size) for p in run.rglob("*") if p.is_file())
    cfg = latest_checkpoint(run)
    assert cfg is not None
    d = cfg.config.to_dict()
    d["run"]["dir"] = str(run)
    d["table"]["tiers"]["store_dir"] = str(run / "stores")
    # the embedded cluster, whose workers share this disk: the driver checks the stores
    # before any worker starts (a cluster's workers check their own, once it is reached)
    d["cluster"] = {**d["cluster"], "address": None, "n_workers": 1, "memory_limit": WORKER_MEMORY}
    path = run.parent / "resume.yaml"
    path.write_text(yaml.safe_dump(d))
    assert main(["train", str(path), "--resume"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("daskhps train: error: cannot train from checkpoint pass-000003")
    assert f"chunk file {chunk} has 1000 bytes" in err and "--checkpoint NAME" in err
    assert sorted((p, p.stat().st_size) for p in run.rglob("*") if p.is_file()) == before

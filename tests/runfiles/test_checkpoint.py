"""Checkpoint files: written in a crash-safe order, verified on every load, torn ones never
loaded, a full disk leaves the previous checkpoint intact. No cluster: plain files and torch."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch

from daskhps.config import RunConfig
from daskhps.errors import CheckpointError, DaskHPSError, StoreNotFoundError
from daskhps.runfiles import checkpoint as ck
from daskhps.runfiles import writing
from daskhps.runfiles.checkpoint import (
    Checkpoint,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
)
from daskhps.table import open_shard_store


def _config(run_dir: Path) -> RunConfig:
    return RunConfig.from_dict(
        {
            "run": {"name": "ck", "dir": str(run_dir)},
            "data": {"train": {"paths": "logs"}},
            "table": {"dim": 4, "optimizer": {"kind": "adagrad"}},
            "cluster": {"n_workers": 2, "gpu": False},
        }
    )


def _model_and_opt(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(8, 3)).sum().backward()
    opt.step()
    return model, opt


def _write(run_dir: Path, passes_done: int, seed: int = 0) -> Checkpoint:
    cfg = _config(run_dir)
    model, opt = _model_and_opt(seed)
    folder = writing.start_checkpoint(run_dir, checkpoint_name(passes_done))
    files = writing.write_payload(
        folder,
        model=model.state_dict(),
        optimizer=opt.state_dict(),
        rng=[torch.get_rng_state()],
        state={"epoch": 1, "pass": passes_done, "step": 10 * passes_done},
    )
    return writing.finish_checkpoint(
        folder,
        files,
        {
            "kind": "delta",
            "passes_done": passes_done,
            "step": 10 * passes_done,
            "commit": folder.name,
            "stores_dir": str(run_dir / "stores"),
            "num_workers": 2,
            "num_shards": 64,
            "table": cfg.table_spec().layout(),
            "config": cfg.to_dict(),
            "metrics": {"auc": 0.7},
        },
    )


def test_round_trip_through_the_manifest(tmp_path: Path) -> None:
    written = _write(tmp_path, 2, seed=5)
    got = load_checkpoint(written.path)
    model, opt = _model_and_opt(5)
    assert got.name == got.commit == "pass-000002"
    assert (got.passes_done, got.step, got.num_workers, got.num_shards) == (2, 20, 2, 64)
    assert got.kind == "delta" and got.metrics == {"auc": 0.7}
    assert got.config == _config(tmp_path)
    assert got.table_spec == _config(tmp_path).table_spec()
    assert got.store_path(1) == tmp_path / "stores" / "embeddings" / "rank-1"
    for k, v in model.state_dict().items():
        assert torch.equal(got.dense_state()[k], v)
    fresh, fresh_opt = _model_and_opt(99)
    fresh.load_state_dict(got.dense_state())
    fresh_opt.load_state_dict(got.optimizer_state())
    assert torch.equal(
        fresh_opt.state_dict()["state"][0]["exp_avg"],
        opt.state[opt.param_groups[0]["params"][0]]["exp_avg"],
    )
    assert got.state()["step"] == 20
    assert len(got.rng_states()) == 1
    m = json.loads((written.path / ck.MANIFEST).read_text())
    assert m["format"] == 1 and set(m["files"]) == {ck.DENSE, ck.STATE}


def test_list_skips_torn_and_damaged_checkpoints(tmp_path: Path) -> None:
    for n in (1, 2, 3):
        _write(tmp_path, n)
    assert [c.passes_done for c in list_checkpoints(tmp_path)] == [1, 2, 3]
    # a checkpoint whose manifest was never written (killed while writing it)
    (tmp_path / "checkpoints" / checkpoint_name(3) / ck.MANIFEST).unlink()
    # a checkpoint whose dense weights changed after the manifest (one byte flipped)
    dense = tmp_path / "checkpoints" / checkpoint_name(2) / ck.DENSE
    data = bytearray(dense.read_bytes())
    data[-20] ^= 0xFF
    dense.write_bytes(bytes(data))
    assert [c.passes_done for c in list_checkpoints(tmp_path)] == [1]
    assert latest_checkpoint(tmp_path).passes_done == 1  # type: ignore[union-attr]
    assert load_checkpoint(tmp_path).passes_done == 1
    with pytest.raises(CheckpointError, match=r"dense.pt does not match the sha256"):
        load_checkpoint(dense.parent)
    with pytest.raises(CheckpointError, match=r"no MANIFEST.json"):
        load_checkpoint(tmp_path / "checkpoints" / checkpoint_name(3))


def _damage_each_way(run_dir: Path) -> dict[str, tuple[str, str]]:
    """Checkpoints 1 and 6 intact; 2 to 5 each damaged one way: {name: (kind, reason)}."""
    for n in range(1, 7):
        _write(run_dir, n)
    folder = run_dir / "checkpoints"
    (folder / checkpoint_name(2) / ck.MANIFEST).unlink()  # killed before its manifest
    (folder / checkpoint_name(3) / ck.MANIFEST).write_text('{"format": 1, "name": ')
    dense = folder / checkpoint_name(4) / ck.DENSE
    size = dense.stat().st_size
    dense.write_bytes(dense.read_bytes()[:1234])  # truncated
    (folder / checkpoint_name(5) / ck.STATE).unlink()
    flipped = folder / checkpoint_name(6) / ck.DENSE
    data = bytearray(flipped.read_bytes())
    data[100] ^= 0x01
    flipped.write_bytes(bytes(data))
    return {
        "pass-000002": ("incomplete", "no MANIFEST.json: its writing never finished"),
        "pass-000003": ("unreadable", "MANIFEST.json does not parse"),
        "pass-000004": ("damaged", f"dense.pt is 1234 bytes, the manifest says {size}"),
        "pass-000005": ("damaged", "state.json is missing"),
        "pass-000006": (
            "damaged",
            f"dense.pt does not match the sha256 in the manifest (same "
            f"size, {size} bytes, different bytes)",
        ),
    }


def test_every_skipped_checkpoint_is_named_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    want = _damage_each_way(tmp_path)
    found, skipped = ck.scan_checkpoints(tmp_path)
    assert [c.name for c in found] == ["pass-000001"]
    got = {s.name: (s.kind, s.reason) for s in skipped}
    assert got.keys() == want.keys()
    for name, (kind, reason) in want.items():
        assert got[name][0] == kind and got[name][1].startswith(reason), (name, got[name])
    # the paths resume and predict take (the latest checkpoint) warn about each, by name
    with caplog.at_level("WARNING", logger="daskhps.runfiles.checkpoint"):
        assert load_checkpoint(tmp_path).name == "pass-000001"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(want)
    assert (
        f"skipping checkpoint pass-000004: {want['pass-000004'][1]} (damaged; never loaded)"
        in lines
    )
    assert all(line.startswith("skipping checkpoint pass-0000") for line in lines)


def test_find_checkpoint_names_the_problem_and_the_valid_ones(tmp_path: Path) -> None:
    want = _damage_each_way(tmp_path)
    assert ck.find_checkpoint(tmp_path, "pass-000001").name == "pass-000001"
    assert ck.find_checkpoint(tmp_path, "1").name == "pass-000001"
    with pytest.raises(CheckpointError) as info:
        ck.find_checkpoint(tmp_path, "pass-000004")
    assert str(info.value) == (
        f"checkpoint pass-000004 of {tmp_path} cannot be used: {want['pass-000004'][1]} "
        "(damaged); valid checkpoints: pass-000001"
    )
    with pytest.raises(CheckpointError, match=r"pass-000002 .*no MANIFEST.json.*\(incomplete\)"):
        ck.find_checkpoint(tmp_path, "2")
    with pytest.raises(CheckpointError) as info:
        ck.find_checkpoint(tmp_path, "pass-000009")
    assert str(info.value) == (
        f"run directory {tmp_path} has no checkpoint 'pass-000009'; valid checkpoints: pass-000001"
    )
    with pytest.raises(CheckpointError, match="not a run directory"):
        ck.find_checkpoint(tmp_path / "checkpoints", "pass-000001")


def test_bad_paths_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("run: {}\n")
    with pytest.raises(CheckpointError, match="has no complete checkpoint"):
        load_checkpoint(tmp_path / "run")
    with pytest.raises(CheckpointError, match="neither a checkpoint"):
        load_checkpoint(tmp_path)
    c = _write(tmp_path / "new", 1)
    m = json.loads((c.path / ck.MANIFEST).read_text())
    m["format"] = ck.FORMAT + 1
    (c.path / ck.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match=f"format {ck.FORMAT + 1} is newer"):
        load_checkpoint(c.path)
    assert isinstance(CheckpointError("x"), DaskHPSError)


def test_full_disk_leaves_the_previous_checkpoint_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _write(tmp_path, 1)
    real = writing._write_all

    def half_then_full(fd: int, data: bytes) -> None:
        real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writing, "_write_all", half_then_full)
    with pytest.raises(CheckpointError, match=r"No space left on device.*earlier checkpoints"):
        _write(tmp_path, 2)
    monkeypatch.setattr(writing, "_write_all", real)
    assert [c.name for c in list_checkpoints(tmp_path)] == [before.name]
    assert load_checkpoint(tmp_path).dense_state().keys() == before.dense_state().keys()
    torn = tmp_path / "checkpoints" / checkpoint_name(2)
    assert not (torn / ck.MANIFEST).exists()
    assert not list(torn.glob("*.tmp"))  # the half-written file was removed
    # the next attempt (after space was freed) replaces the torn folder
    assert _write(tmp_path, 2).passes_done == 2
    assert [c.passes_done for c in list_checkpoints(tmp_path)] == [1, 2]


def test_full_disk_while_writing_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, 1)
    real = writing._write_file

    def manifest_fails(path: Path, data: bytes) -> dict:
        if path.name == ck.MANIFEST:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, data)

    monkeypatch.setattr(writing, "_write_file", manifest_fails)
    with pytest.raises(CheckpointError, match=r"MANIFEST.json failed: .*No space left"):
        _write(tmp_path, 2)
    assert [c.passes_done for c in list_checkpoints(tmp_path)] == [1]


def test_remove_checkpoint_deletes_the_manifest_first(tmp_path: Path) -> None:
    c = _write(tmp_path, 1)
    writing.remove_checkpoint(c.path)
    assert not c.path.exists()
    assert list_checkpoints(tmp_path) == []


def _stores(run_dir: Path, commits: list[str]) -> None:
    """Both ranks' stores of ``_write``'s checkpoints, with a commit of each name."""
    spec = _config(run_dir).table_spec()
    for rank in (0, 1):
        with open_shard_store(spec, run_dir / "stores" / "embeddings" / f"rank-{rank}") as s:
            for i, name in enumerate(commits):
                keys = torch.arange(10 * i, 10 * i + 10 + rank, dtype=torch.int64)
                s.upsert(keys, torch.full((len(keys), spec.width), float(i)))
                s.commit(name)


def test_inspect_lists_checkpoints_and_unfinished_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from daskhps.cli import main
    from daskhps.training.inspection import describe, render

    _write(tmp_path, 1)
    _write(tmp_path, 2)
    _stores(tmp_path, ["pass-000001", "pass-000002"])
    writing.start_checkpoint(tmp_path, checkpoint_name(3))  # killed before its manifest
    info = describe(tmp_path)
    assert [c["passes_done"] for c in info["checkpoints"]] == [1, 2]
    assert info["incomplete"] == ["pass-000003"]
    assert info["skipped"][0]["kind"] == "incomplete"
    first = info["checkpoints"][0]
    assert first["table"] == {"name": "embeddings", "dim": 4, "optimizer": "adagrad"}
    assert [s["store_rows"] for s in first["shards"]] == [10, 11]
    assert not info["damaged"] and first["read_from_copy"] is None
    text = render(info)
    assert "pass-000003: incomplete, never loaded: no MANIFEST.json" in text
    assert "rank 1: store 11 rows" in text and "DAMAGED" not in text
    assert main(["inspect", str(tmp_path / "checkpoints" / "pass-000002"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoints"][0]["step"] == 20
    # rank 1's store gone (on another machine's disk), and no copy: one line, not damage
    os.rename(tmp_path / "stores" / "embeddings" / "rank-1", tmp_path / "rank-1-elsewhere")
    with pytest.raises(StoreNotFoundError) as e:
        describe(tmp_path)
    store = tmp_path / "stores" / "embeddings" / "rank-1"
    assert f"reads stores that are not on this machine (no store at {store})" in str(e.value)
    assert main(["inspect", str(tmp_path / "checkpoints" / "pass-000002")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("daskhps inspect: error: checkpoint ") and err.count("\n") == 1
    assert "set checkpoint.replicate_to for the run" in err
    assert main(["inspect", str(tmp_path / "nothing")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("daskhps inspect: error:") and "does not exist" in err

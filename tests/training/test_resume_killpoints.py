"""Crash and resume on a real LocalCluster (worker processes, gloo, zarr stores on disk).

The driver (``python -m daskhps.cli train``) SIGKILLs itself at each named kill point; the
resumed run must end bit-identical to one uninterrupted run (dense weights, optimizer state,
every embedding row, every batch loss), a torn checkpoint is never loaded, and the killed
driver's workers are gone (their store locks free). Resuming on 2 workers instead of 1
re-shards the stores and ends within the worker-count tolerance of docs/invariants.md (invariant 3).
The runs in this process (the reference, the full disk) use a shared warm cluster of the same
shape (tests/_clusters.py); those killed and resumed start their own, as a user's would; the
resumes refused before any cluster starts go through the command line's ``main`` in this
process (tests/_runs.py ``cli_here``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from daskhps.cli import main as cli_main
from daskhps.config import RunConfig, load_config
from daskhps.errors import CheckpointError
from daskhps.runfiles import checkpoint as ck
from daskhps.runfiles import writing
from daskhps.runfiles.checkpoint import MANIFEST, Checkpoint, latest_checkpoint, list_checkpoints
from daskhps.table import EmbeddingTable
from daskhps.tiers.store import open_store
from daskhps.training.trainer import RunResult, Trainer
from tests._clusters import SharedClusters
from tests._logs import generated_logs
from tests._runs import cli, cli_here, tiny_config
from tests.serve.helpers import tree_state

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # day 1: 1500 rows = 3 passes of 500 (5 batches each); day 2: the holdout
    return generated_logs(tmp_path_factory, days=2, rows_per_day=1500, parts_per_day=2, seed=3)


def _write_config(folder: Path, logs: Path, **cluster: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    d = tiny_config(
        folder / "run",
        logs,
        run={"name": "kill"},
        data={"holdout": {"day": "last"}},
        # pass 1 a base, pass 2 a delta, pass 3 a base; pass 1's is dropped at pass 3
        checkpoint={"every_passes": 1, "keep": 2, "full_every": 2},
        cluster={"processes": True, **cluster},
    )
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def _in_process(config: Path, clusters: SharedClusters) -> RunConfig:
    """``config`` for a run in this process, on the shared cluster of its shape."""
    d = yaml.safe_load(config.read_text())
    d["cluster"] = clusters.section(workers=1, threads=2)
    return RunConfig.from_dict(d, source=str(config))


def _cli(config: Path, *args: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    return cli("train", str(config), *args, kill_at=kill_at, timeout=300)


def _rows(ckpt: Checkpoint) -> dict[int, np.ndarray]:
    """Every row (embedding, optimizer state, statistics) of every shard at the checkpoint's
    commit."""
    out: dict[int, np.ndarray] = {}
    for r in range(ckpt.num_workers):
        with EmbeddingTable.open(
            ckpt.table_spec, ckpt.store_path(r), device_rows=16, mode="r", commit=ckpt.commit
        ) as t:
            keys = t.store.keys()
            out.update(zip(keys.tolist(), t.peek(keys).numpy(), strict=True))
    return out


def _ends_as(run_dir: Path, ref_ckpt: Checkpoint, ref_rows: dict[int, np.ndarray]) -> Checkpoint:
    """The run's final checkpoint, checked against the reference's: 3 passes, every dense
    weight and every stored row bit for bit."""
    final = latest_checkpoint(run_dir)
    assert final is not None and final.passes_done == 3
    for k, v in ref_ckpt.dense_state().items():
        assert torch.equal(final.dense_state()[k], v), k
    rows = _rows(final)
    assert rows.keys() == ref_rows.keys()
    assert all(np.array_equal(rows[k].view(np.int32), ref_rows[k].view(np.int32)) for k in rows)
    return final


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"  # a zombie holds no lock


def _lock_holders(run_dir: Path) -> list[int]:
    pids = []
    for lock in (run_dir / "stores").glob("*/rank-*/LOCK"):
        text = lock.read_text().split()
        if len(text) > 1 and text[0] == "pid":
            pids.append(int(text[1]))
    return pids


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory, logs: Path, shared_clusters: SharedClusters
) -> tuple[RunResult, Checkpoint, dict[int, np.ndarray]]:
    """One uninterrupted run (in this process): its result, final checkpoint and rows."""
    config = _write_config(tmp_path_factory.mktemp("reference"), logs)
    result = Trainer(_in_process(config, shared_clusters), progress=False).run()
    ckpt = latest_checkpoint(load_config(config).run.dir)
    assert ckpt is not None and ckpt.passes_done == 3 == len(result.passes)
    return result, ckpt, _rows(ckpt)


def _killed(config: Path, kill_at: str, *args: str) -> None:
    """Run (or resume, with ``args``) until the driver SIGKILLs itself at ``kill_at``; then
    check that its workers exit on their own (their parent's pipe closed), freeing the
    stores' locks for the next run."""
    run = _cli(config, *args, kill_at=kill_at)
    assert run.returncode == -signal.SIGKILL, (kill_at, run.stderr[-3000:])
    holders = _lock_holders(config.parent / "run")
    assert holders, "the killed run's workers never locked a store"
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in holders) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in holders), f"{kill_at}: the dead driver's workers still run"


def _latest(run_dir: Path) -> int:
    latest = latest_checkpoint(run_dir)
    return 0 if latest is None else latest.passes_done


def _torn(run_dir: Path, passes_done: int) -> Path:
    folder = run_dir / "checkpoints" / f"pass-{passes_done:06d}"
    assert folder.is_dir() and not (folder / MANIFEST).exists()
    return folder


def test_killed_at_every_point_then_resumed_ends_bit_identical(
    tmp_path: Path,
    logs: Path,
    reference: tuple[RunResult, Checkpoint, dict[int, np.ndarray]],
) -> None:
    """One run killed at every kill point in turn (each resume is killed at the next one),
    then resumed to the end: every resume starts from the last complete checkpoint."""
    ref, ref_ckpt, ref_rows = reference
    config = _write_config(tmp_path, logs)
    run_dir = tmp_path / "run"
    _killed(config, "after_checkpoint:0")
    assert _latest(run_dir) == 1
    _killed(config, "stage:2", "--resume")  # pass 2 staged while pass 1 trains
    assert _latest(run_dir) == 1
    _killed(config, "mid_pass:1", "--resume")
    assert _latest(run_dir) == 1
    _killed(config, "checkpoint_dense:1", "--resume")
    assert (_torn(run_dir, 2) / "dense.pt").exists() and _latest(run_dir) == 1
    _killed(config, "checkpoint_commit:2", "--resume")  # pass 3's is a base (compaction)
    _torn(run_dir, 3)
    assert _latest(run_dir) == 2

    resumed = _cli(config, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = latest_checkpoint(run_dir)
    assert final is not None and final.passes_done == 3 and final.kind == "base"
    for k, v in ref_ckpt.dense_state().items():
        assert torch.equal(final.dense_state()[k], v), k
    ref_opt, opt = ref_ckpt.optimizer_state()["state"], final.optimizer_state()["state"]
    assert ref_opt.keys() == opt.keys()
    for i in ref_opt:
        for name, value in ref_opt[i].items():
            assert torch.equal(opt[i][name], value), (i, name)
    rows = _rows(final)
    assert rows.keys() == ref_rows.keys()
    for key, row in ref_rows.items():
        assert np.array_equal(rows[key].view(np.int32), row.view(np.int32)), key
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["batch_losses"] for r in records] == [p["batch_losses"] for p in ref.passes]
    assert records[-1]["eval"] == ref.final_eval
    # keep: 2 -- the oldest checkpoint and the store commits only it used are gone
    assert [c.passes_done for c in list_checkpoints(run_dir)] == [2, 3]


def test_resume_checks_the_config_then_reshards_to_two_workers(
    tmp_path: Path,
    logs: Path,
    reference: tuple[RunResult, Checkpoint, dict[int, np.ndarray]],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    ref, ref_ckpt, ref_rows = reference
    config = _write_config(tmp_path, logs)
    nothing = cli_here(capfd, caplog, "train", str(config), "--resume")
    assert nothing.returncode == 1
    assert "holds no complete checkpoint" in nothing.stderr and "Traceback" not in nothing.stderr

    _killed(config, "after_checkpoint:0")  # one pass done on one worker
    refused = cli_here(
        capfd,
        caplog,
        *("train", str(config), "--resume"),
        *("--set", "table.dim=8", "--set", "dense_optimizer.kind=sgd"),
    )
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert "table.dim: 4 -> 8" in line and "dense_optimizer.kind: 'adam' -> 'sgd'" in line
    assert _latest(tmp_path / "run") == 1  # nothing was touched

    resumed = _cli(config, "--resume", "--set", "cluster.n_workers=2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = latest_checkpoint(tmp_path / "run")
    assert final is not None and final.passes_done == 3 and final.num_workers == 2
    assert final.stores_dir.name.endswith("-resharded-pass-000001-w2")

    def rel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    dense = final.dense_state()
    a = np.concatenate([v.numpy().ravel() for v in ref_ckpt.dense_state().values()])
    b = np.concatenate([dense[k].numpy().ravel() for k in ref_ckpt.dense_state()])
    assert rel(b, a) < 1e-3  # adaptive optimizers, 10 steps after the re-shard: invariant 3
    rows = _rows(final)
    assert rows.keys() == ref_rows.keys()  # every row moved to its new owner, none lost
    keys = sorted(ref_rows)
    assert rel(np.stack([rows[k] for k in keys]), np.stack([ref_rows[k] for k in keys])) < 1e-3
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3
    assert abs(json.loads(lines[-1])["eval"]["auc"] - ref.final_eval["auc"]) < 0.003


def test_full_disk_at_a_checkpoint_stops_the_run_then_resume_ends_the_same(
    tmp_path: Path,
    logs: Path,
    reference: tuple[RunResult, Checkpoint, dict[int, np.ndarray]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    shared_clusters: SharedClusters,
) -> None:
    """The disk fills up half-way through pass 2's dense.pt: the run stops with a clear
    error, pass 1's checkpoint stays the latest and loads; resuming ends like the reference;
    ``daskhps inspect`` then tells what the run's checkpoints hold."""
    ref, ref_ckpt, ref_rows = reference
    cfg = _in_process(_write_config(tmp_path, logs), shared_clusters)
    run_dir = tmp_path / "run"
    real_file, real_all = writing._write_file, writing._write_all
    opened: list[Path] = []

    def tracked(path: Path, data: bytes) -> dict[str, Any]:
        opened.append(path)
        return real_file(path, data)

    def full_disk(fd: int, data: bytes) -> None:
        if opened[-1].parent.name == "pass-000002" and opened[-1].name == ck.DENSE:
            real_all(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_all(fd, data)

    monkeypatch.setattr(writing, "_write_file", tracked)
    monkeypatch.setattr(writing, "_write_all", full_disk)
    with pytest.raises(CheckpointError, match=r"pass-000002 failed: .*No space left.*intact"):
        Trainer(cfg, progress=False).run()
    monkeypatch.undo()
    assert _latest(run_dir) == 1
    assert latest_checkpoint(run_dir).dense_state()  # type: ignore[union-attr]
    assert not (run_dir / "checkpoints" / "pass-000002").exists()  # no half checkpoint left

    Trainer(cfg, progress=False).run(resume=True)
    final = _ends_as(run_dir, ref_ckpt, ref_rows)
    # pass 3's checkpoint is a base: the store was compacted and its commit is a full index
    # snapshot; pass 2's is a delta that only lists the segments written since
    spec = final.table_spec
    with open_store(
        final.store_path(0), name="t", width=spec.width, layout=spec.layout(), mode="r"
    ) as store:
        snapshot = {c.name: c.snapshot for c in store.commits()}
    assert snapshot == {"pass-000002": False, "pass-000003": True}

    capsys.readouterr()
    assert cli_main(["inspect", str(run_dir), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in info["checkpoints"]] == ["pass-000002", "pass-000003"]
    last = info["checkpoints"][-1]
    assert last["rows"] == len(ref_rows) and last["num_workers"] == 1
    assert last["days"] == ["2024-01-01"] and last["kind"] == "base"
    assert last["metrics"]["auc"] == ref.final_eval["auc"]
    assert last["daskhps_version"] and last["files"]["dense.pt"] > 0
    assert cli_main(["inspect", str(final.path)]) == 0
    text = capsys.readouterr().out
    assert "pass-000003 (base" in text and f"{len(ref_rows):,} rows" in text


def test_a_store_lost_with_its_disk_is_restored_from_the_copy(
    tmp_path: Path,
    logs: Path,
    reference: tuple[RunResult, Checkpoint, dict[int, np.ndarray]],
    shared_clusters: SharedClusters,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """``checkpoint.replicate_to`` as a ``file://`` URL: the driver is killed once pass 2's
    checkpoint and its copy are complete, and rank 0's local store goes with its disk. The
    resume restores it from the copy and ends bit-identical to the reference; the copy then
    holds the kept checkpoints, each loadable where it lies; and the model loader of predict
    and serving reads the copy when a checkpoint's store is damaged. A location that cannot
    be written is one line before anything of the run changes."""
    from daskhps.serve.version import load_servable

    _, ref_ckpt, ref_rows = reference
    config = _write_config(tmp_path, logs)
    d = yaml.safe_load(config.read_text())
    d["checkpoint"]["replicate_to"] = f"file://{tmp_path / 'copy'}"
    config.write_text(yaml.safe_dump(d))
    run_dir = tmp_path / "run"
    _killed(config, "after_replica:1")
    assert _latest(run_dir) == 2
    lost = run_dir / "stores" / "embeddings" / "rank-0"
    shutil.rmtree(lost)
    caplog.set_level(logging.INFO, "daskhps.training")
    Trainer(_in_process(config, shared_clusters), progress=False).run(resume=True)
    assert "restored rank 0's store of pass-000002 from file://" in caplog.text
    final = _ends_as(run_dir, ref_ckpt, ref_rows)
    rows = _rows(final)

    copies = list_checkpoints(tmp_path / "copy")  # keep: 2, in the copy as well
    assert [c.passes_done for c in copies] == [2, 3]
    assert copies[-1].stores_dir == tmp_path / "copy" / "stores" / "stores"
    copied = _rows(copies[-1])
    assert copied.keys() == rows.keys()
    assert all(np.array_equal(copied[k], v) for k, v in rows.items())
    chunk = max(
        (p for p in (lost / "segments").rglob("*") if p.is_file() and "/c/" in p.as_posix()),
        key=lambda p: p.stat().st_size,
    )  # the base's compacted rows: read at its commit
    chunk.write_bytes(chunk.read_bytes()[:-4])  # the local store damaged: served from the copy
    served = load_servable(run_dir, copies[-1].name)  # the latest (the run's best may differ)
    assert served.table.stores_dir == copies[-1].stores_dir

    before = {**tree_state(run_dir), **tree_state(tmp_path / "copy")}
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for where in (blocked / "copy", Path("/proc/daskhps-copy")):
        refused = cli_here(
            *(capfd, caplog, "train", str(config), "--resume", "--overwrite"),
            *("--set", f"checkpoint.replicate_to={where}"),
        )
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        line = refused.stderr.strip().splitlines()[-1]
        assert f"checkpoint.replicate_to: cannot write checkpoints to {where}" in line, line
    assert {**tree_state(run_dir), **tree_state(tmp_path / "copy")} == before

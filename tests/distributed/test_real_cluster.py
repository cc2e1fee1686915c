"""The quickstart on a real Dask cluster: ``dask scheduler`` and ``dask worker`` processes on
127.0.0.1 (tests/_real_cluster.py), reached with ``--set cluster.address=...`` as
docs/operations.md shows. A worker SIGKILLed mid-run is recovered from by itself: the model
is the embedded cluster's, bit for bit, when the worker is replaced (its disk lost with it:
the store comes back from checkpoint.replicate_to), and within the
worker-count tolerance when the run goes on with fewer. A scheduler without workers is one
line; TLS with cluster.security."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from daskhps.cli import main
from daskhps.runfiles.checkpoint import list_checkpoints, load_checkpoint
from daskhps.training import killpoints
from tests._real_cluster import RealCluster
from tests._tls import make_tls

pytestmark = pytest.mark.slow

QUICKSTART = Path(__file__).parents[2] / "configs" / "quickstart.yaml"


def _small(tmp: Path, name: str) -> list[str]:
    """The quickstart, a tenth of its size, into ``tmp``."""
    return [
        "train", str(QUICKSTART),
        "--set", f"run.dir={tmp / name}",
        "--set", f"data.generate.out={tmp / 'data'}",
        "--set", "data.generate.rows_per_day=40000",
        "--set", "data.generate.parts_per_day=2",
        "--set", "passes.examples_per_pass=10000",
        "--set", "run.quiet=true",
    ]  # fmt: skip


def _sets(overrides: list[str]) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def _store_of(cluster: RealCluster, worker: int, stores: Path) -> Path:
    """The rank store that worker process ``worker`` holds open (its LOCK names the pid of a
    process in the worker's process group)."""
    for lock in stores.glob("rank-*/LOCK"):
        words = lock.read_text().split()
        if len(words) > 1 and words[0] == "pid":
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(int(words[1])) == cluster.workers[worker].pid:
                    return lock.parent
    raise AssertionError(f"worker {worker} holds no store in {stores}")


def _kill_mid_pass(
    monkeypatch: pytest.MonkeyPatch,
    cluster: RealCluster,
    run_dir: Path,
    rank: int,
    replace: bool,
    lose: Path | None = None,
) -> dict[str, str]:
    """SIGKILL worker ``rank`` (and its nanny) in the middle of the run's third pass: the
    driver runs in this process, so its ``mid_pass`` kill point (daskhps.training.killpoints)
    is armed at schedule position 2 with this kill in place of the driver's own. The driver
    trains a pass only once the previous one is checkpointed (and copied), so the worker dies
    with pass-000002 the newest checkpoint, whatever the passes' speed. Once only: the pass
    the run trains again after recovering is not killed. With ``lose`` (the run's stores of
    its table), the store the worker held goes too (its disk lost); start a replacement if
    ``replace``. Returns what the kill saw: the newest checkpoint then, and the lost store."""
    seen: dict[str, str] = {}

    def kill(point: str, position: int) -> None:
        if seen:
            return
        os.environ.pop(killpoints.ENV, None)
        seen["checkpoint"] = list_checkpoints(run_dir)[-1].name
        held = _store_of(cluster, rank, lose) if lose is not None else None
        cluster.kill_worker(rank)
        if held is not None:
            shutil.rmtree(held)
            seen["lost"] = held.name
        if replace:
            cluster.add_worker(wait=False)

    monkeypatch.setattr(killpoints, "_die", kill)
    monkeypatch.setenv(killpoints.ENV, "mid_pass:2")
    return seen


def _same_model(a: Path, b: Path, rtol: float = 0.0) -> None:
    ca, cb = load_checkpoint(a), load_checkpoint(b)
    assert ca.passes_done == cb.passes_done
    da, db = ca.dense_state(), cb.dense_state()
    assert da.keys() == db.keys()
    for k in da:
        if rtol == 0.0:
            assert torch.equal(da[k], db[k]), k
        else:
            scale = float(da[k].abs().max()) or 1.0
            assert float((da[k] - db[k]).abs().max()) <= rtol * scale, k


def test_the_quickstart_on_dask_worker_processes_recovers_from_lost_workers(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Uninterrupted on the embedded cluster; then on `dask worker` processes with a worker
    SIGKILLed mid-run: replaced (the same model, bit for bit), and not replaced (re-sharded
    onto the one left, within the worker-count tolerance: 1e-3 relative, 0.003 AUC)."""
    assert main(_small(tmp_path, "embedded")) == 0
    with RealCluster(tmp_path / "cluster", workers=2, memory_limit="3GiB") as cluster:
        # the file's embedded-cluster settings (n_workers, memory_limit, ...) are set aside
        at = ["--set", f"cluster.address={cluster.address}", "--set", "cluster.restart_wait_s=5"]
        # the replaced worker's disk is lost too: its store comes back from the copy
        copy = tmp_path / "copy"
        killed = {
            "replaced": _kill_mid_pass(
                monkeypatch,
                cluster,
                tmp_path / "replaced",
                1,
                replace=True,
                lose=tmp_path / "replaced" / "stores" / "embeddings",
            )
        }
        replicated = ["--set", f"checkpoint.replicate_to=file://{copy}"]
        assert main([*_small(tmp_path, "replaced"), *at, *replicated]) == 0
        assert killed["replaced"], "the run was never at the kill point: no worker was killed"
        lost, at_kill = killed["replaced"]["lost"], killed["replaced"]["checkpoint"]
        restored = f"restored {lost.replace('-', ' ')}'s store of {at_kill}"
        assert restored in caplog.text, caplog.text[-2000:]
        assert cluster.alive() == 2  # the run closed its shards, not the operator's workers
        killed["fewer"] = _kill_mid_pass(monkeypatch, cluster, tmp_path / "fewer", 0, replace=False)
        # no worker comes back: the run waits restart_wait_s for one, then re-shards
        no_wait = ["--set", "cluster.restart_wait_s=1"]
        assert main([*_small(tmp_path, "fewer"), *at, *no_wait]) == 0
    capsys.readouterr()
    _same_model(tmp_path / "embedded", tmp_path / "replaced")
    _same_model(tmp_path / "embedded", tmp_path / "fewer", rtol=1e-3)
    for name, after in (("replaced", 2), ("fewer", 1)):
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        (restart,) = summary["restarts"]
        # recovery continued from the newest checkpoint there was when the worker died
        assert killed[name].get("checkpoint") == "pass-000002", (name, killed[name])  # pass 3
        assert restart["checkpoint"] == killed[name]["checkpoint"], (restart, killed[name])
        assert restart["workers_after"] == after
        assert "left the cluster" in restart["cause"] or "failed" in restart["cause"]
        lines = [
            json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        ]
        assert [x["restart"]["restart"] for x in lines if "restart" in x] == [1]
        assert sum("train_loss" in x for x in lines) == summary["passes"]
    auc = {
        n: json.loads((tmp_path / n / "summary.json").read_text())["final_eval"]["auc"]
        for n in ("embedded", "fewer")
    }
    assert abs(auc["embedded"] - auc["fewer"]) < 0.003
    replaced, embedded = (
        load_checkpoint(tmp_path / "replaced"),
        load_checkpoint(tmp_path / "embedded"),
    )
    for rank in range(2):  # every stored row too
        with replaced.open_store(rank) as s, embedded.open_store(rank) as t:
            keys = t.keys()
            assert torch.equal(s.keys().sort().values, keys.sort().values)
            assert torch.equal(s.lookup(keys).rows, t.lookup(keys).rows)


def test_a_scheduler_without_workers_or_with_too_small_ones_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No worker yet: one line naming the scheduler. Then a worker of 400 MiB for a device
    tier of 4M rows (512 MB): one line naming the tier's key and the workers' memory limit,
    and nothing of the run is trained or checkpointed."""
    with RealCluster(tmp_path / "cluster", workers=0, memory_limit="400MiB") as cluster:
        argv = [*_small(tmp_path, "run"), "--set", f"cluster.address={cluster.address}"]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"the scheduler at {cluster.address} has no workers" in err, err
        cluster.add_worker()
        assert main([*argv, "--set", "table.tiers.device={rows: 4000000}"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert "the run cannot fit" in err and "table.tiers.device.rows" in err, err
        assert "start the workers with a larger --memory-limit" in err, err
        assert f"at cluster.address {cluster.address}" in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_tls_cluster_with_the_files_of_cluster_security(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tls = make_tls(tmp_path / "tls")
    with RealCluster(tmp_path / "cluster", workers=2, memory_limit="3GiB", tls=tls) as cluster:
        assert cluster.address.startswith("tls://127.0.0.1:")
        at = ["--set", f"cluster.address={cluster.address}"]
        argv = [*_small(tmp_path, "tls"), *at]
        # without the files: refused before anything starts
        assert main(argv) == 1
        assert "is TLS: give cluster.security" in capsys.readouterr().err
        missing = [o.replace("key.pem", "nope.pem") for o in tls.overrides()]
        assert main([*argv, *_sets(missing)]) == 1
        err = capsys.readouterr().err
        assert "cluster.security.key_file: no such file" in err and err.count("\n") == 1, err
        assert not (tmp_path / "tls" / "run").exists()
        assert main([*argv, *_sets(tls.overrides())]) == 0
    assert load_checkpoint(tmp_path / "tls").passes_done > 1

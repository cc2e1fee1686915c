"""The quickstart on a real Dask cluster: ``dask scheduler`` and ``dask worker`` processes on
127.0.0.1 (tests/_real_cluster.py), reached with ``--set cluster.address=...`` as
docs/operations.md shows. It trains the same model, bit for bit, as the embedded cluster of the
same shape; a scheduler without workers is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from daskhps.cli import main
from daskhps.training.checkpoint import load_checkpoint
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
        "--set", "data.generate.rows_per_day=20000",
        "--set", "data.generate.parts_per_day=2",
        "--set", "passes.examples_per_pass=10000",
        "--set", "run.quiet=true",
    ]  # fmt: skip


def _sets(overrides: list[str]) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def test_the_quickstart_on_dask_scheduler_and_dask_worker_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_small(tmp_path, "embedded")) == 0
    with RealCluster(tmp_path / "cluster", workers=2, memory_limit="3GiB") as cluster:
        # the file's embedded-cluster settings (n_workers, memory_limit, ...) are set aside
        argv = [*_small(tmp_path, "real"), "--set", f"cluster.address={cluster.address}"]
        assert main(argv) == 0, (tmp_path / "cluster").glob("*.log")
        assert cluster.alive() == 2  # the run closed its shards, not the operator's workers
    capsys.readouterr()
    embedded, real = (load_checkpoint(tmp_path / n) for n in ("embedded", "real"))
    assert embedded.name == real.name and embedded.passes_done == real.passes_done > 1
    a, b = embedded.dense_state(), real.dense_state()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    for rank in range(2):
        with embedded.open_store(rank) as s, real.open_store(rank) as t:
            keys = s.keys()
            assert torch.equal(keys.sort().values, t.keys().sort().values)
            assert torch.equal(s.lookup(keys).rows, t.lookup(keys).rows)


def test_a_scheduler_without_workers_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with RealCluster(tmp_path / "cluster", workers=0) as cluster:
        argv = [*_small(tmp_path, "run"), "--set", f"cluster.address={cluster.address}"]
        assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"the scheduler at {cluster.address} has no workers" in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()


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

"""Relative paths in a config mean the driver's folder on every worker, and a run whose
workers can read none of the training files fails in one line.

Real ``dask scheduler`` and ``dask worker`` processes (tests/_real_cluster.py), the workers
started in a folder of their own, the driver (``python -m daskhps.cli``) in another.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from daskhps.runfiles.checkpoint import list_checkpoints
from tests._logs import generated_logs
from tests._real_cluster import RealCluster
from tests._runs import cli, tiny_config, write_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logs(tmp_path_factory, days=2, rows_per_day=1000, parts_per_day=2, seed=7)


def _driver(tmp_path: Path, logs: Path) -> Path:
    """A driver folder holding the logs and ``run.yaml``, a config that names every path
    relatively."""
    driver = tmp_path / "driver"
    shutil.copytree(logs, driver / "logs")
    cfg = tiny_config(Path("runs/rel"), Path("logs"), data={"holdout": {"day": "last"}})
    cfg["run"]["dir"] = "runs/rel"
    cfg["data"]["train"]["paths"] = ["logs"]
    cfg["table"]["tiers"]["store_dir"] = "stores/rel"
    write_config(driver / "run.yaml", cfg)
    return driver


def test_relative_paths_mean_the_drivers_folder_on_every_worker(tmp_path: Path, logs: Path) -> None:
    driver = _driver(tmp_path, logs)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with RealCluster(tmp_path / "cluster", workers=1, cwd=elsewhere) as cluster:
        run = cli("train", "run.yaml", "--set", f"cluster.address={cluster.address}", cwd=driver)
    assert run.returncode == 0, run.stderr[-3000:]
    assert list(elsewhere.iterdir()) == []  # nothing written where the workers started
    ckpt = list_checkpoints(driver / "runs" / "rel")[-1]
    assert ckpt.stores_dir == driver / "stores" / "rel"
    assert (driver / "stores" / "rel").is_dir()
    assert ckpt.passes_done == 2


def test_a_run_whose_workers_read_no_file_fails_in_one_line(tmp_path: Path, logs: Path) -> None:
    driver = _driver(tmp_path, logs)
    with RealCluster(tmp_path / "cluster", workers=1, hide=driver / "logs") as cluster:
        run = cli("train", "run.yaml", "--set", f"cluster.address={cluster.address}", cwd=driver)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert "none of the 2 training files gave a row" in last, run.stderr[-3000:]
    assert str(driver / "logs" / "day=2024-01-01") in last
    assert f"cluster.address {cluster.address}" in last
    assert "Traceback" not in run.stderr
    assert not (driver / "runs" / "rel" / "checkpoints").exists()

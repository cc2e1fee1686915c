"""What ``daskhps train`` says about a real cluster (``dask scheduler`` and ``dask worker``
processes, tests/_real_cluster.py), through the real command line in a subprocess: the
workers' memory limit, read as ``daskhps plan`` reads it; a scheduler address where nothing
listens, said in seconds; a scheduler that is still starting, waited for."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests._logs import generated_logs
from tests._real_cluster import RealCluster
from tests._runs import cli, tiny_config, write_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    logs = generated_logs(tmp_path_factory, days=2, rows_per_day=500, parts_per_day=1, seed=3)
    folder = tmp_path_factory.mktemp("messages")
    d = tiny_config(folder / "run", logs, data={"holdout": {"day": "last"}})
    return write_config(folder / "run.yaml", d)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_train_sizes_the_workers_memory_as_plan_does(tmp_path: Path, config: Path) -> None:
    with RealCluster(tmp_path / "cluster", workers=1, memory_limit="400MiB") as cluster:
        at = ["--set", f"cluster.address={cluster.address}"]
        plan = cli("plan", str(config), *at, timeout=120)
        assert "(limit 400.0 MiB)" in plan.stdout, plan.stdout
        # a device tier of 4M rows (512 MB) cannot fit a worker of 400 MiB
        big = ["--set", "table.tiers.device={rows: 4000000}"]
        run = cli("train", str(config), *at, *big, timeout=300)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "memory not sized" not in run.stderr and "limit unknown" not in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert "its memory limit 400.0 MiB" in last and f"cluster.address {cluster.address}" in last
    assert not (config.parent / "run" / "checkpoints").exists()


def test_a_refused_scheduler_port_is_said_in_seconds(config: Path) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    started = time.monotonic()
    run = cli("train", str(config), "--set", f"cluster.address={address}", timeout=120)
    took = time.monotonic() - started
    assert run.returncode == 1, run.stderr
    assert run.stderr.splitlines()[-1] == (
        f"daskhps train: error: cluster.address {address}: no Dask scheduler there (connection "
        f"refused for 5 s); start it (`dask scheduler --port {address.rsplit(':', 1)[1]}`) or "
        "fix the address"
    )
    assert "Traceback" not in run.stderr and run.stderr.count("error") == 1, run.stderr
    assert took < 30, took  # the client's own wait is 60 s


def test_a_scheduler_that_is_starting_is_waited_for(tmp_path: Path, config: Path) -> None:
    """Its port refuses connections until it binds: a scheduler started 2 s after ``train``
    is reached (and has no workers, which is what the one line then says)."""
    port = _free_port()
    later: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        time.sleep(2.0)
        argv = [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port",
                str(port), "--no-dashboard"]  # fmt: skip
        later.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    t = threading.Thread(target=start)
    t.start()
    try:
        run = cli("train", str(config), "--set", f"cluster.address=tcp://127.0.0.1:{port}")
    finally:
        t.join()
        for p in later:
            p.terminate()
            p.wait(30)
    assert run.returncode == 1, run.stderr
    assert "no Dask scheduler there" not in run.stderr, run.stderr
    assert f"the scheduler at tcp://127.0.0.1:{port} has no workers" in run.stderr, run.stderr

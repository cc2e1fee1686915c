"""Hosts with memory of their own (tests/_hosts.py ``memory``: a cgroup the kernel enforces,
each host's disk a folder of the real disk whose page cache counts against it): a host that
outgrows its memory is killed by the kernel mid-run and the run recovers to the uninterrupted
run's model bit for bit; a worker whose Dask limit its cgroup will not give is said before
anything is sized on it, and sized on the cgroup's limit."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from daskhps.runfiles.checkpoint import list_checkpoints
from tests._hosts import Hosts, hosts_config, model_of, same_model
from tests._logs import generated_logs
from tests._runs import cli, tiny_config, write_config
from tests._signals import default_dispositions

pytestmark = pytest.mark.slow

MiB = 1 << 20
HOST_MEMORY = 1280 * MiB  # a worker of these runs holds about 0.5 GiB


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logs(tmp_path_factory, days=2, rows_per_day=1000, parts_per_day=2, seed=7)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    root = tmp_path_factory.mktemp("hosts")
    with Hosts(root / "processes", 2, disk=root / "disk", memory=HOST_MEMORY, threads=2) as h:
        yield h
    assert h.driver_sees() == []


def _outgrow_memory() -> None:
    """Map and fault in 4 GiB at once: past any host's cgroup, so the kernel kills this
    process (the largest of its host) in the middle of the call."""
    mmap.mmap(-1, 4 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)


def _worker_of(hosts: Hosts, i: int) -> str:
    """The address of host ``i``'s worker (the child of its nanny, the process started)."""
    with hosts.client() as client:
        parents = client.run(os.getppid)
    (address,) = [a for a, parent in parents.items() if parent == hosts.workers[i].pid]
    return str(address)


def test_a_host_that_outgrows_its_memory_is_killed_by_the_kernel_and_the_run_recovers(
    tmp_path: Path, logs: Path, hosts: Hosts
) -> None:
    plain = cli("train", str(hosts_config(tmp_path, logs, hosts, "plain", wait_s=60)), timeout=300)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "memory cgroup" not in plain.stderr  # each host's Dask limit is within its cgroup
    assert hosts.oom_kills(0) == hosts.oom_kills(1) == 0
    victim = 1
    config = hosts_config(tmp_path, logs, hosts, "oom", wait_s=60)
    driver = subprocess.Popen(
        [sys.executable, "-m", "daskhps.cli", "train", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_dispositions,
    )
    try:
        deadline = time.monotonic() + 120
        while not list_checkpoints(tmp_path / "oom-copy"):
            assert driver.poll() is None, driver.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no copied checkpoint within 120 s"
            time.sleep(0.2)
        with hosts.client() as client, pytest.raises(Exception):  # noqa: B017 -- any way it dies
            client.run(_outgrow_memory, workers=[_worker_of(hosts, victim)])
        _, err = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, err[-3000:]
    assert hosts.oom_kills(victim) == 1 and hosts.oom_kills(0) == 0
    assert hosts.alive_hosts() == [0, 1]  # the nanny started the worker again, on its disk
    assert hosts.peak_memory(victim) <= HOST_MEMORY
    assert same_model(
        model_of(tmp_path / "oom", tmp_path / "oom-copy"),
        model_of(tmp_path / "plain", tmp_path / "plain-copy"),
    )


def test_a_worker_whose_cgroup_is_below_its_dask_limit_is_said_and_sized_on_the_cgroup(
    tmp_path: Path, logs: Path
) -> None:
    root = tmp_path / "capped"
    with Hosts(
        root / "processes", 1, disk=root / "disk", memory=1024 * MiB, memory_limit="2GiB"
    ) as capped:
        config = write_config(
            tmp_path / "plan.yaml",
            tiny_config(tmp_path / "run", logs, cluster_section={"address": capped.address}),
        )
        plan = cli("plan", str(config), "--scan", timeout=120)
    assert plan.returncode == 0, plan.stderr[-3000:]
    said = [line for line in plan.stderr.splitlines() if "memory cgroup" in line]
    assert len(said) == 1, plan.stderr
    assert "runs in a memory cgroup of 1.00 GiB, below its Dask memory_limit of 2.00 GiB" in said[0]
    assert "--memory-limit 921MiB" in said[0]
    assert "memory per worker at its peak (limit 1.0 GiB)" in plan.stdout, plan.stdout

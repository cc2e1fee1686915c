"""Runs on several hosts, each with a disk nobody else sees (tests/_hosts.py): nothing on the
driver opens a rank store, ranks follow their stores, a killed driver's workers let go of the
run, a lost host's stores come back from the copy.

One set of hosts serves the whole module (starting them is most of a test's time); each test
trains in its own folders, and one that loses a host replaces it before it ends.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from daskhps.training.checkpoint import latest_checkpoint, list_checkpoints
from tests._hosts import Hosts
from tests._logs import generated_logs
from tests._runs import cli, tiny_config, write_config
from tests._signals import default_dispositions

pytestmark = pytest.mark.slow

HOSTS = 2


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logs(tmp_path_factory, days=2, rows_per_day=1000, parts_per_day=2, seed=7)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    root = tmp_path_factory.mktemp("hosts")
    with Hosts(
        root / "processes", HOSTS, disk=root / "disk", readonly=root / "readonly", threads=2
    ) as h:
        yield h
    assert h.driver_sees() == []  # nobody wrote the workers' store path on the driver's side


def _config(tmp_path: Path, logs: Path, hosts: Hosts, name: str, **keys: object) -> Path:
    cfg = tiny_config(
        tmp_path / name,
        logs,
        cluster_section={"address": hosts.address, "max_restarts": 2, "restart_wait_s": 30},
        data={"holdout": {"day": "last"}},
        passes={"examples_per_pass": 300},
        table={"tiers": {"store_dir": str(hosts.disk / name)}},
        checkpoint={"replicate_to": str(tmp_path / f"{name}-copy")},
        **keys,
    )
    return write_config(tmp_path / f"{name}.yaml", cfg)


def _dense(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None
    return ckpt.dense_state()


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, logs: Path, hosts: Hosts) -> Path:
    """A run trained to its end on the hosts (its folder)."""
    tmp_path = tmp_path_factory.mktemp("plain")
    run = cli("train", str(_config(tmp_path, logs, hosts, "plain")), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return tmp_path / "plain"


def test_a_run_trains_with_every_store_on_its_own_hosts_disk(plain: Path, hosts: Hosts) -> None:
    ckpt = latest_checkpoint(plain)
    assert ckpt is not None and ckpt.passes_done == 4
    on_disks = [hosts.files(i, "plain") for i in hosts.alive_hosts()]
    ranks = [{f.split("/")[2] for f in files} for files in on_disks]
    assert sorted(map(sorted, ranks)) == [["rank-0"], ["rank-1"]]


def _disks(hosts: Hosts) -> list[list[str]]:
    return [hosts.files(i) for i in hosts.alive_hosts()]


@pytest.mark.parametrize(
    ("keys", "line"),
    [
        (
            {"table.tiers.store_dir": "{readonly}/stores"},
            "table.tiers.store_dir: on worker tcp://127.0.0.1:",
        ),
        (
            {"checkpoint.replicate_to": "{readonly}/copy"},
            "checkpoint.replicate_to: on worker tcp://127.0.0.1:",
        ),
        (
            {"table.tiers.store_dir": "{disk}/plain"},
            "already holds table stores at {disk}/plain/embeddings",
        ),
    ],
    ids=["stores-unwritable", "copy-unwritable", "another-runs-stores"],
)
def test_bad_input_on_the_hosts_is_one_line_and_changes_no_disk(
    tmp_path: Path, logs: Path, hosts: Hosts, plain: Path, keys: dict[str, str], line: str
) -> None:
    where = {"readonly": hosts.readonly_dir, "disk": hosts.disk}
    config = _config(tmp_path, logs, hosts, "bad")
    disks, copy = _disks(hosts), sorted(plain.parent.rglob("*"))
    sets = [f"{k}={v.format(**where)}" for k, v in keys.items()]
    run = cli("train", str(config), *(a for kv in sets for a in ("--set", kv)), timeout=300)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert line.format(**where) in last, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert _disks(hosts) == disks and sorted(plain.parent.rglob("*")) == copy
    assert list(hosts.readonly_dir.iterdir()) == []  # type: ignore[union-attr]
    assert not (tmp_path / "bad" / "checkpoints").exists()


def test_a_killed_driver_leaves_nothing_held_and_resume_continues(
    tmp_path: Path, logs: Path, hosts: Hosts
) -> None:
    config = _config(tmp_path, logs, hosts, "killed")
    run = cli("train", str(config), kill_at="after_checkpoint:1", timeout=300)
    assert run.returncode == -9, run.stderr[-3000:]
    assert [c.passes_done for c in list_checkpoints(tmp_path / "killed")][-1] == 2
    resumed = cli("train", str(config), "--resume", timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert latest_checkpoint(tmp_path / "killed").passes_done == 4  # type: ignore[union-attr]
    whole = _config(tmp_path, logs, hosts, "whole")
    assert cli("train", str(whole), timeout=300).returncode == 0
    a, b = _dense(tmp_path / "killed"), _dense(tmp_path / "whole")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_host_lost_with_its_disk_comes_back_from_the_copy(
    tmp_path: Path, logs: Path, hosts: Hosts
) -> None:
    config = _config(tmp_path, logs, hosts, "lost")
    run_dir = tmp_path / "lost"
    driver = subprocess.Popen(
        [sys.executable, "-m", "daskhps.cli", "train", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_dispositions,
    )
    try:
        # a checkpoint whose copy is complete (the copy follows the local checkpoint: a host
        # lost before it is done leaves nothing to restore from)
        copy, deadline = tmp_path / "lost-copy", time.monotonic() + 120
        while not list_checkpoints(copy) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert list_checkpoints(copy), "no checkpoint copied within 120 s"
        victim = hosts.alive_hosts()[0]
        hosts.lose(victim)
        hosts.add_host()
        _, err = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, err[-3000:]
    assert "(it was on no worker's disk)" in err, err[-3000:]
    whole = _config(tmp_path, logs, hosts, "whole")
    assert cli("train", str(whole), timeout=300).returncode == 0
    a, b = _dense(run_dir), _dense(tmp_path / "whole")
    assert all(torch.equal(a[k], b[k]) for k in a)

"""Runs on several hosts, each with a disk nobody else sees (tests/_hosts.py): nothing on the
driver opens a rank store, ranks follow their stores, a killed driver's workers let go of the
run, a lost host's stores come back from the copy, logs and the copy in a bucket (an S3 server on
127.0.0.1, tests/_s3.py) give the same run.

One set of hosts serves the whole module (starting them is most of a test's time); each test
trains in its own folders, and one that loses a host replaces it before it ends.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from daskhps.runfiles.checkpoint import latest_checkpoint, list_checkpoints
from tests._clusters import WORKER_MEMORY
from tests._hosts import Hosts, hosts_config
from tests._logs import generated_logs
from tests._runs import cli, tiny_config, write_config
from tests._signals import default_dispositions

pytestmark = pytest.mark.slow

HOSTS = 4  # the count; each test's run is small: correctness, not speed


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logs(tmp_path_factory, days=2, rows_per_day=1000, parts_per_day=2, seed=7)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    root = tmp_path_factory.mktemp("hosts")
    # A tmpfs of 128 MiB for each host's disk: one that fills (the disk-too-small case).
    with Hosts(
        root / "processes",
        HOSTS,
        disk=root / "disk",
        readonly=root / "readonly",
        disk_size="128m",
        threads=2,
    ) as h:
        yield h
    assert h.driver_sees() == []  # nobody wrote the workers' store path on the driver's side


def _dense(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None
    return ckpt.dense_state()


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, logs: Path, hosts: Hosts) -> Path:
    """A run trained to its end on the hosts (its folder)."""
    tmp_path = tmp_path_factory.mktemp("plain")
    run = cli("train", str(hosts_config(tmp_path, logs, hosts, "plain")), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return tmp_path / "plain"


def _rows(ckpt_folder: Path) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Every rank's keys (sorted) and their rows at the latest checkpoint of ``ckpt_folder``
    (a run folder, or a copy at checkpoint.replicate_to, read where it lies)."""
    ckpt = latest_checkpoint(ckpt_folder)
    assert ckpt is not None
    out = {}
    for r in range(ckpt.num_workers):
        with ckpt.open_store(r) as store:
            keys = store.keys().sort().values
            out[r] = (keys.numpy(), store.lookup(keys).rows.numpy())
    return out


def _same_rows(a: Path, b: Path) -> None:
    ra, rb = _rows(a), _rows(b)
    assert ra.keys() == rb.keys()
    for r in ra:
        assert np.array_equal(ra[r][0], rb[r][0]) and np.array_equal(ra[r][1], rb[r][1]), r


def test_a_run_on_hosts_is_the_run_on_an_embedded_cluster_bit_for_bit(
    tmp_path: Path, logs: Path, plain: Path, hosts: Hosts
) -> None:
    ckpt = latest_checkpoint(plain)
    assert ckpt is not None and ckpt.passes_done == 4 and ckpt.num_workers == HOSTS
    on_disks = [hosts.files(i, "plain") for i in hosts.alive_hosts()]
    ranks = [{f.split("/")[2] for f in files} for files in on_disks]
    assert sorted(map(sorted, ranks)) == [[f"rank-{r}"] for r in range(HOSTS)]
    embedded = tiny_config(
        tmp_path / "embedded",
        logs,
        data={"holdout": {"day": "last"}},
        passes={"examples_per_pass": 300},
        cluster={"n_workers": HOSTS, "threads_per_worker": 2, "memory_limit": WORKER_MEMORY},
    )
    run = cli("train", str(write_config(tmp_path / "embedded.yaml", embedded)), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    a, b = _dense(plain), _dense(tmp_path / "embedded")
    assert all(torch.equal(a[k], b[k]) for k in a)
    _same_rows(plain.parent / "plain-copy", tmp_path / "embedded")  # the hosts' rows, copied


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
        (
            {"table.expected_keys": "16000000"},  # about 0.4 GiB of rows: a 128 MiB disk each
            "table.tiers.store_dir: on worker tcp://127.0.0.1:",
        ),
    ],
    ids=["stores-unwritable", "copy-unwritable", "another-runs-stores", "disk-too-small"],
)
def test_bad_input_on_the_hosts_is_one_line_and_changes_no_disk(
    tmp_path: Path, logs: Path, hosts: Hosts, plain: Path, keys: dict[str, str], line: str
) -> None:
    where = {"readonly": hosts.readonly_dir, "disk": hosts.disk}
    config = hosts_config(tmp_path, logs, hosts, "bad")
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
    tmp_path: Path, logs: Path, hosts: Hosts, plain: Path
) -> None:
    config = hosts_config(tmp_path, logs, hosts, "killed")
    run = cli("train", str(config), kill_at="after_checkpoint:1", timeout=300)
    assert run.returncode == -9, run.stderr[-3000:]
    assert [c.passes_done for c in list_checkpoints(tmp_path / "killed")][-1] == 2
    resumed = cli("train", str(config), "--resume", timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert latest_checkpoint(tmp_path / "killed").passes_done == 4  # type: ignore[union-attr]
    a, b = _dense(tmp_path / "killed"), _dense(plain)
    assert all(torch.equal(a[k], b[k]) for k in a)
    _same_rows(tmp_path / "killed-copy", plain.parent / "plain-copy")


def _summary(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "summary.json").read_text()))


def _train_in_background(config: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "daskhps.cli", "train", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_dispositions,
    )


def _wait_for_a_copy(copy: Path, driver: subprocess.Popen[str]) -> None:
    """A host lost before any checkpoint's copy is whole cannot come back: wait for one."""
    deadline = time.monotonic() + 120
    while not list_checkpoints(copy) and time.monotonic() < deadline:
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        time.sleep(0.2)
    assert list_checkpoints(copy), "no copied checkpoint within 120 s"


def test_a_host_lost_with_its_disk_comes_back_from_the_copy(
    tmp_path: Path, logs: Path, hosts: Hosts, plain: Path
) -> None:
    config = hosts_config(tmp_path, logs, hosts, "lost")
    run_dir = tmp_path / "lost"
    driver = _train_in_background(config)
    try:
        _wait_for_a_copy(tmp_path / "lost-copy", driver)
        victim = hosts.alive_hosts()[0]
        hosts.lose(victim)
        hosts.add_host()
        _, err = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, err[-3000:]
    assert "(it was on no worker's disk): " in err, err[-3000:]
    restored = next(line for line in err.splitlines() if "on no worker's disk" in line)
    assert re.search(r"disk\): \d[\d.]* [kKMGT]?i?B in \d+\.\d\d s \(", restored), restored
    a, b = _dense(run_dir), _dense(plain)
    assert all(torch.equal(a[k], b[k]) for k in a)
    _same_rows(tmp_path / "lost-copy", plain.parent / "plain-copy")


def test_a_host_lost_and_not_replaced_reshards_onto_the_hosts_left(
    tmp_path: Path, logs: Path, hosts: Hosts, plain: Path
) -> None:
    """On the workers, through the cluster: the driver sees no store (the module's fixture
    checks that nothing landed on its side of the hosts' disk path)."""
    config = hosts_config(tmp_path, logs, hosts, "fewer", wait_s=3)
    run_dir = tmp_path / "fewer"
    driver = _train_in_background(config)
    try:
        _wait_for_a_copy(tmp_path / "fewer-copy", driver)
        hosts.lose(hosts.alive_hosts()[-1])
        _, err = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
        hosts.add_host()  # the next tests have their count of hosts again
    assert driver.returncode == 0, err[-3000:]
    final = latest_checkpoint(run_dir)
    assert final is not None and final.num_workers == HOSTS - 1 and final.passes_done == 4
    (restart,) = _summary(run_dir)["restarts"]
    assert (restart["workers_before"], restart["workers_after"]) == (HOSTS, HOSTS - 1)
    a, b = _dense(run_dir), _dense(plain)  # the worker-count tolerance (docs/checkpoints.md)
    for k in a:
        assert float((a[k] - b[k]).abs().max()) <= 1e-3 * (float(b[k].abs().max()) or 1.0), k
    auc = [
        json.loads((d / "summary.json").read_text())["final_eval"]["auc"] for d in (run_dir, plain)
    ]
    assert abs(auc[0] - auc[1]) < 0.003


def test_a_new_run_that_fails_before_its_first_checkpoint_leaves_no_store_on_the_hosts(
    tmp_path: Path, logs: Path, hosts: Hosts
) -> None:
    garbage = tmp_path / "garbage" / "day=2024-01-01"
    garbage.mkdir(parents=True)
    (garbage / "part-0.tsv").write_text("not\ta\tclick\tlog\n" * 50)
    (garbage / "_SUCCESS").write_text("")
    config = hosts_config(tmp_path, garbage.parent, hosts, "failed", data={"holdout": None})
    run = cli("train", str(config), timeout=300)
    assert run.returncode != 0
    assert "gave a row" in run.stderr.strip().splitlines()[-1], run.stderr[-3000:]
    assert all(hosts.files(i, "failed") == [] for i in hosts.alive_hosts())
    again = cli("train", str(config), timeout=300)  # the same command fails the same way
    assert again.stderr.strip().splitlines()[-1] == run.stderr.strip().splitlines()[-1]


def test_inspect_on_the_drivers_machine_reads_the_copy(plain: Path) -> None:
    """The stores are on the hosts' disks: inspect says so and reports the copy's, sound."""
    run = cli("inspect", str(plain), timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "damaged" not in run.stdout, run.stdout[-3000:]
    assert f"read from the copy at {plain.parent / 'plain-copy'}" in run.stdout, run.stdout


def test_logs_and_the_copy_in_a_bucket_train_the_same_run_bit_for_bit(
    tmp_path: Path, logs: Path, hosts: Hosts, plain: Path
) -> None:
    """The module's run with its logs read from a bucket and its copy written to one: the
    hosts reach the S3 server only through the config's ``storage.options`` (their
    environment names no endpoint and no credentials), and the run is the local one."""
    from tests._s3 import s3_server

    reach = ("AWS_ACCESS", "AWS_SECRET", "AWS_ENDPOINT", "FSSPEC_S3")
    assert not any(k.startswith(reach) for k in hosts._env)
    with s3_server() as server:
        url = server.upload(logs, server.bucket("clicks") + "/logs")
        copy = server.bucket("copies") + "/run"
        config = hosts_config(
            tmp_path,
            logs,
            hosts,
            "bucket",
            data={"holdout": {"day": "last"}, "train": {"paths": [url]}},
            checkpoint={"replicate_to": copy},
            storage={"options": server.options},
        )
        run = cli("train", str(config), timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        server.fs().get(copy.split("://", 1)[1], str(tmp_path / "copied"), recursive=True)
    names = [c.name for c in list_checkpoints(tmp_path / "copied")]
    assert names == [c.name for c in list_checkpoints(plain.parent / "plain-copy")]
    assert names[-1] == latest_checkpoint(tmp_path / "bucket").name  # type: ignore[union-attr]
    a, b = _dense(tmp_path / "bucket"), _dense(plain)
    assert all(torch.equal(a[k], b[k]) for k in a)
    _same_rows(tmp_path / "copied", plain.parent / "plain-copy")
    assert not (tmp_path / "bucket-copy").exists()
    assert hosts.driver_sees() == []  # the stores are on the hosts' disks only

"""Daily retraining on several hosts, each with a disk nobody else sees (tests/_hosts.py):
publishing, retention and rollback change the rank stores where they lie, the driver sees none
of them, and the versions are those the same days give on one disk shared by the workers, bit
for bit.

Three days arrive, ``keep_versions: 1``, and each run goes to the hosts and to a cluster of the
same shape whose workers share the driver's disk (the session's warm LocalCluster of 2 workers,
tests/_clusters.py: an embedded cluster of its own would cost twice the run) alike:

1. 01-01 and 01-02 complete: train 01-01 from scratch, score 01-02, publish v000001; its commit
   is in both hosts' stores;
2. 01-03 completes: train 01-02 from v000001 (its stores reopened at its commit on the hosts
   that hold them), score 01-03, publish v000002, remove v000001: its commit is gone from both
   hosts' stores, with every segment only it used;
3. a rollback asks the hosts whether each rank's store holds the version's commit;
4. a server on the driver's machine follows the registry to v000002 and reads its rows
   through the copy at ``checkpoint.replicate_to``, answering as the shared disk's does.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from daskhps.cli import main
from daskhps.retrain import ExitCode, Registry
from daskhps.runfiles.checkpoint import latest_checkpoint, load_checkpoint
from daskhps.serve.export import EMBEDDINGS, KEYS
from daskhps.serve.server import ServeOptions
from tests._clusters import SharedClusters
from tests._hosts import Hosts
from tests._logs import generated_logs
from tests._runs import tiny_config, write_config
from tests.retrain.test_retrain_e2e import DAYS, _arrive
from tests.serve.helpers import Running

pytestmark = pytest.mark.slow

HOSTS = 2

# Inside a host's mount namespace: the commit names of every rank store under a folder of its
# disk, and the segment folders no remaining commit reads.
_COMMITS = """
import json, sys
from pathlib import Path
from daskhps.tiers.store.manifest import scan_manifests
out = {}
for store in sorted(Path(sys.argv[1]).glob("*/*/rank-*")):
    manifests, _ = scan_manifests(store / "commits")
    used = {s for m in manifests for s in m.segments}
    orphans = [p.name for p in (store / "segments").iterdir()
               if p.name.isdigit() and int(p.name) not in used]
    out[store.name] = {"commits": sorted(m.name for m in manifests), "orphans": orphans}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def all_days(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logs(
        tmp_path_factory, days=3, rows_per_day=1000, parts_per_day=2, seed=5, name="host-days"
    )


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    root = tmp_path_factory.mktemp("hosts")
    with Hosts(root / "processes", HOSTS, disk=root / "disk", threads=2) as h:
        yield h
    assert h.driver_sees() == []  # nobody wrote the workers' store path on the driver's side


def _config(root: Path, name: str, logs: Path, **keys: Any) -> Path:
    d = tiny_config(
        root / name,
        logs,
        run={"name": "rt"},
        data={"train": {"require_complete": True}},
        passes={"examples_per_pass": 1000, "global_batch_size": 100},
        eval={"every_pass": False},
        # no guard but a finite logloss: both sequences publish every candidate
        retrain={"max_auc_drop": None, "keep_versions": 1},
        **keys,
    )
    return write_config(root / f"{name}.yaml", d)


def _on_disk(hosts: Hosts, i: int) -> dict[str, Any]:
    """Host ``i``'s rank stores: their commit names and orphan segments."""
    out = hosts.run_on(i, sys.executable, "-c", _COMMITS, str(hosts.disk / "rt"))
    return dict(json.loads(out))


def _retrain(*args: str) -> None:
    """``daskhps retrain ARGS`` in this process (a driver like any other: it holds no disk of
    the hosts), which publishes."""
    assert main(["retrain", *args]) == ExitCode.PUBLISHED


@pytest.fixture(scope="module")
def runs(
    all_days: Path,
    hosts: Hosts,
    tmp_path_factory: pytest.TempPathFactory,
    shared_clusters: SharedClusters,
) -> dict[str, Any]:
    """The two days' runs on the hosts and on one shared disk, the hosts' disks after each."""
    root = tmp_path_factory.mktemp("retrain-hosts")
    logs = root / "logs"
    on_hosts = _config(
        root,
        "hosts",
        logs,
        cluster_section={"address": hosts.address},
        table={"tiers": {"store_dir": str(hosts.disk / "rt")}},
        checkpoint={"replicate_to": str(root / "copy")},
    )
    shared = shared_clusters.section(workers=HOSTS, threads=2)
    one_disk = _config(root, "shared", logs, cluster_section=shared)
    disks = []
    _arrive(all_days, logs, DAYS[0])
    _arrive(all_days, logs, DAYS[1])
    for day in (None, DAYS[2]):
        if day is not None:
            _arrive(all_days, logs, day)
        _retrain(str(on_hosts))
        disks.append([_on_disk(hosts, i) for i in range(HOSTS)])
        assert hosts.driver_sees() == []
        _retrain(str(one_disk))
    return {
        "root": root,
        "hosts": root / "hosts",
        "shared": root / "shared",
        "config": on_hosts,
        "disks": disks,
        "holdout": sorted(all_days.glob(f"day={DAYS[2]}/part-*")),
    }


def test_versions_are_committed_and_dropped_on_the_hosts_disks(
    runs: dict[str, Any], hosts: Hosts
) -> None:
    registry = Registry(runs["hosts"] / "versions")
    v2 = registry.current()
    assert v2 is not None and v2.name == "v000002" and v2.parent == "v000001"
    assert registry.removed("v000001") and not (registry.folder / "v000001").exists()
    after_v1, after_v2 = runs["disks"]
    # each host holds one rank's store, never the other's
    assert sorted(sorted(d) for d in after_v2) == [["rank-0"], ["rank-1"]]
    for d in after_v1:
        assert [s["commits"] for s in d.values()] == [["pass-000001", "version-v000001"]]
    for d in after_v2:
        (store,) = d.values()
        assert "version-v000002" in store["commits"]
        assert "version-v000001" not in store["commits"]  # retention dropped it on its host
        assert store["orphans"] == []  # with every segment only it used
    assert hosts.driver_sees() == []


def test_rollback_asks_the_hosts_that_hold_the_stores(
    runs: dict[str, Any], hosts: Hosts, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(runs["config"])
    capsys.readouterr()
    _retrain(config, "--rollback", "v000002")
    assert "CURRENT is now v000002 (was v000002)" in capsys.readouterr().out
    assert main(["retrain", config, "--rollback", "v000001"]) == ExitCode.BAD_CONFIG
    assert "removed by retrain.keep_versions" in capsys.readouterr().err
    # v000002's commit moved aside on one host: refused in one line naming the rank
    v2 = load_checkpoint(runs["hosts"] / "versions" / "v000002")
    i = next(i for i in range(HOSTS) if "rank-1" in runs["disks"][1][i])
    found = hosts.run_on(
        i, "grep", "-l", '"version-v000002"', *_manifests(hosts, i, v2.stores_dir)
    ).split()
    hosts.run_on(i, "mv", found[0], found[0] + ".aside")
    try:
        code = main(["retrain", config, "--rollback", "v000002"])
    finally:
        hosts.run_on(i, "mv", found[0] + ".aside", found[0])
    err = capsys.readouterr().err
    assert code == ExitCode.ERROR, err
    (line,) = err.strip().splitlines()
    assert "commit 'version-v000002' is gone from the store of rank 1 on any of the 2 " in line
    assert (runs["hosts"] / "versions" / "CURRENT").read_text() == "v000002\n"
    assert hosts.driver_sees() == []


def _manifests(hosts: Hosts, i: int, stores: Path) -> list[str]:
    folder = stores / "embeddings" / "rank-1" / "commits"
    return [str(hosts.disk / f) for f in hosts.files(i, str(folder.relative_to(hosts.disk)))]


def _answers(run_dir: Path, out: Path, holdout: Path) -> dict[str, Any]:
    """A server's answer to the holdout's lines, following the registry of ``run_dir``, and
    the exported rows of the version it serves."""
    assert main(["export", "--model", str(run_dir), "--out", str(out)]) == 0
    served = Running(ServeOptions(model=str(run_dir), device_rows=2000, host_bytes=1 << 20))
    try:
        answer = served.client.predict_lines(holdout.read_text())
        version = served.server.version
    finally:
        served.close()
    return {
        "version": version,
        "serve": np.array(answer.probabilities),
        "keys": np.load(out / KEYS),
        "embeddings": np.load(out / EMBEDDINGS),
    }


def test_the_hosts_versions_are_those_of_one_shared_disk_bit_for_bit(
    runs: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    ours, theirs = Registry(runs["hosts"] / "versions"), Registry(runs["shared"] / "versions")
    assert [v.name for v in ours.versions()] == [v.name for v in theirs.versions()]
    for a, b in zip(ours.versions(), theirs.versions(), strict=True):
        assert (a.train_days, a.eval_day, a.metrics) == (b.train_days, b.eval_day, b.metrics)
    v2, e2 = ours.get("v000002"), theirs.get("v000002")
    da, db = (
        load_checkpoint(v2.checkpoint).dense_state(),
        load_checkpoint(e2.checkpoint).dense_state(),
    )
    assert all(torch.equal(da[k], db[k]) for k in da)
    # the driver reads v000002's rows through the copy of the candidate it was frozen from
    got = _answers(runs["hosts"], runs["root"] / "export-hosts", runs["holdout"][0])
    assert "its rows are read from the copy at" in caplog.text
    want = _answers(runs["shared"], runs["root"] / "export-shared", runs["holdout"][0])
    assert got["version"] == want["version"] == "v000002" and len(got["keys"]) > 0
    for k in ("serve", "keys", "embeddings"):
        assert np.array_equal(got[k], want[k]), k


def test_publishing_restores_a_store_lost_with_its_disk_from_the_copy_or_says_so(
    runs: dict[str, Any], hosts: Hosts, tmp_path: Path
) -> None:
    """The candidate's store of rank 1 gone from its host's disk when it is published: the
    copy restores it onto the worker left without a store, which commits the version; with no
    copy, one line naming the rank and the version, and nothing is published. (Last: the
    other host's store keeps the commit of the version frozen here, outside the registry.)"""
    from distributed import Client

    from daskhps.errors import ResumeError
    from daskhps.retrain.publish import freeze_version
    from daskhps.retrain.stores import Disks

    attempt = Registry(runs["hosts"] / "versions").attempts()[-1].id
    cand = latest_checkpoint(runs["hosts"] / "attempts" / attempt)
    assert cand is not None
    store = str(cand.store_path(1))
    i = next(i for i in range(HOSTS) if "rank-1" in runs["disks"][1][i])
    copy, aside = runs["root"] / "copy", runs["root"] / "copy-aside"
    hosts.run_on(i, "mv", store, f"{store}.aside")
    try:
        with Client(hosts.address) as client:
            disks = Disks(client, "test")
            copy.rename(aside)
            try:
                with pytest.raises(ResumeError) as refused:
                    freeze_version(cand, tmp_path / "v000009", "v000009", disks)
            finally:
                aside.rename(copy)
            assert not (tmp_path / "v000009").exists()
            line = str(refused.value)
            assert line.startswith(f"cannot publish v000009 from {cand.name} of ")
            assert "the store of rank 1 is on none of the 2 workers' disks" in line
            assert "nothing was published" in line and "\n" not in line
            frozen = freeze_version(cand, tmp_path / "v000009", "v000009", disks)
        assert frozen.commit == "version-v000009"
        on_disk = _on_disk(hosts, i)
        assert "version-v000009" in on_disk["rank-1"]["commits"]  # restored there, committed
    finally:
        hosts.run_on(i, "rm", "-rf", store)
        hosts.run_on(i, "mv", f"{store}.aside", store)
    assert hosts.driver_sees() == []

"""The embedded CPU cluster's workers are forks of one server that imported their code once
(daskhps._forkserver): they start with that code loaded, and see what a spawned worker
would: the driver's environment and working directory as they are when the cluster starts,
Dask's pre-spawn variables and hash seed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from daskhps import _forkserver as forkserver
from daskhps._forkserver_exit import SERVER
from daskhps.config.cluster import ClusterConfig
from daskhps.distributed import start_cluster
from tests._clusters import WORKER_MEMORY

pytestmark = pytest.mark.skipif(not forkserver.available(), reason="no forkserver here")


def _what_a_worker_sees() -> dict[str, Any]:
    import torch

    return {
        # torch._dynamo is loaded by a torch optimizer, which no task built yet
        "preloaded": [m for m in ("torch._dynamo", "daskhps.training.holdout") if m in sys.modules],
        # the server's own exit (daskhps._forkserver_exit), not the worker's
        "server_mark": os.environ.get(SERVER),
        "parent": os.getppid(),
        "late": os.environ.get("DASKHPS_TEST_SET_LATE"),
        "cwd": os.getcwd(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": torch.get_num_threads(),
        "hash_seed": os.environ.get("PYTHONHASHSEED"),
        "hash": hash("daskhps"),
    }


def test_forked_workers_start_loaded_and_see_the_drivers_environment_and_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forkserver.warm_up()  # as a run does first; what follows happens after it
    monkeypatch.setenv("DASKHPS_TEST_SET_LATE", "after the server started")
    monkeypatch.chdir(tmp_path)
    with start_cluster(
        n_workers=2,
        threads_per_worker=1,
        memory_limit=WORKER_MEMORY,
        processes=True,
        gpus=False,
        dashboard_address=None,
    ) as handle:
        seen = list(handle.client.run(_what_a_worker_sees).values())
    assert len(seen) == 2
    for worker in seen:
        assert worker["preloaded"] == ["torch._dynamo", "daskhps.training.holdout"], worker
        assert worker["parent"] != os.getpid()  # the fork server's child, not the driver's
        assert worker["late"] == "after the server started"
        assert worker["cwd"] == str(tmp_path)
        assert worker["omp"] == "1" and worker["torch_threads"] == 1
        assert worker["hash_seed"] == "6640"  # a Dask nanny's: strings hash alike everywhere
        assert worker["server_mark"] is None
    assert seen[0]["hash"] == seen[1]["hash"]


@pytest.mark.parametrize(
    ("cluster", "forks"),
    [
        ({"gpu": False}, True),
        ({"gpu": "auto"}, True),  # no dask_cuda here: a CPU cluster
        ({"gpu": False, "processes": False}, False),  # in-process workers fork nothing
        ({"address": "tcp://127.0.0.1:8786"}, False),  # `dask worker` processes start alone
        ({"gpu": True}, False),  # dask_cuda's workers keep their start method
    ],
)
def test_only_an_embedded_cpu_cluster_of_processes_forks_its_workers(
    cluster: dict[str, Any], forks: bool
) -> None:
    if cluster.get("gpu") == "auto" and importlib.util.find_spec("dask_cuda"):
        pytest.skip("dask_cuda is installed: 'auto' depends on the device")
    config = ClusterConfig.model_validate(cluster)
    assert forkserver.forks_workers(config) is forks


def test_worker_env_is_the_drivers_now_with_dasks_pre_spawn_variables_and_the_runs_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DASKHPS_TEST_SET_LATE", "now")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    env = forkserver.worker_env({"OMP_NUM_THREADS": "3"})
    assert env["DASKHPS_TEST_SET_LATE"] == "now"
    assert env["OMP_NUM_THREADS"] == "3"  # cluster.worker_env wins, as over a spawned worker
    assert env["MALLOC_TRIM_THRESHOLD_"] == "65536"
    assert env["PYTHONHASHSEED"] == "6640"


def test_the_server_gets_dasks_pre_spawn_variables_before_distributed_is_imported() -> None:
    """`daskhps train` starts the server before anything imports distributed, whose defaults
    hold the pre-spawn variables: without them torch's OpenMP ran 2 threads a worker, one
    spinning, and two workers on 2 cores trained 4x slower."""
    probe = (
        "import sys, json; from daskhps import _forkserver as f; "
        "assert 'distributed' not in sys.modules; print(json.dumps(f._pre_spawn_env()))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTHONHASHSEED")}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout)
    assert got["OMP_NUM_THREADS"] == "1" and got["PYTHONHASHSEED"] == "6640", got


def test_the_server_ignores_ctrl_c_from_its_start() -> None:
    """Ctrl-C reaches the driver's whole process group: a server still importing its preload
    would die of it with a traceback under the driver's message. It starts ignoring SIGINT
    (the ignored-signals mask of /proc, read before its preload can have finished)."""
    probe = (
        "import os, sys; from multiprocessing import forkserver as mf; "
        "from daskhps import _forkserver as f; f.warm_up(); "
        "pid = mf._forkserver._forkserver_pid; "
        "line = [x for x in open(f'/proc/{pid}/status') if x.startswith('SigIgn:')][0]; "
        "print(int(line.split()[1], 16) >> 1 & 1, int(os.kill(pid, 9) is None))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "1"], out.stdout  # SIGINT (bit 2-1) ignored

"""Tiny training runs for the end-to-end tests: one config shape, and the command line in a
subprocess (the way a user runs it: its own interpreter, its own LocalCluster) or, where that
process is not what a test checks, through its ``main`` in the test's process."""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from daskhps.training.killpoints import ENV
from tests._clusters import WORKER_MEMORY

_TINY: dict[str, Any] = {
    "run": {"seed": 1, "quiet": True},
    "passes": {"epochs": 1, "examples_per_pass": 500, "global_batch_size": 100},
    "table": {
        "dim": 4,
        "optimizer": {"kind": "adagrad", "lr": 0.05},
        "tiers": {"device": {"rows": 100_000}, "host": {"fraction": 0.05}},
    },
    "model": {"name": "dlrm", "options": {"bottom_mlp": [8, 4], "top_mlp": [8]}},
    "dense_optimizer": {"kind": "adam", "lr": 0.01},
    "cluster": {
        "n_workers": 1,
        "threads_per_worker": 2,  # pass k+1 staged while pass k trains
        "memory_limit": WORKER_MEMORY,
        "gpu": False,
        "dashboard_address": None,
    },
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def tiny_config(
    run_dir: Path,
    logs: Path,
    *,
    cluster_section: dict[str, Any] | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """A 1-worker CPU run of DLRM (dim 4) on ``logs`` into ``run_dir``; each keyword is a
    config section merged over the defaults (``passes={"examples_per_pass": 200}``).
    ``cluster_section`` replaces the cluster section whole, unmerged: a shared cluster's
    (``SharedClusters.section``) names its address, and the embedded cluster's options (its
    ``n_workers`` above all: how many workers to wait for) must not come with it."""
    own = {
        "run": {"name": run_dir.name, "dir": str(run_dir)},
        "data": {"train": {"paths": [str(logs)]}},
    }
    config = _merge(_merge(_TINY, own), sections)
    if cluster_section is not None:
        config["cluster"] = copy.deepcopy(cluster_section)
    return config


def set_keys(config: dict[str, Any], keys: dict[str, Any]) -> dict[str, Any]:
    """``config`` with each dotted key of ``keys`` set to its value, whole (``{"table.tiers":
    {...}}`` replaces the tiers section; None sets None)."""
    for key, value in keys.items():
        node = config
        *path, last = key.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
    return config


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def cli(
    *args: str, kill_at: str | None = None, timeout: int = 400, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """``python -m daskhps.cli ARGS`` in a subprocess (in ``cwd``, default this process's);
    ``kill_at`` arms a kill point."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if kill_at is not None:
        env[ENV] = kill_at
    return subprocess.run(
        [sys.executable, "-m", "daskhps.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
        cwd=cwd,
    )


def cli_here(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, *args: str
) -> subprocess.CompletedProcess:
    """``daskhps ARGS`` through the command line's own ``main`` in this process: the code
    :func:`cli` runs, less a fresh interpreter's start (seconds of imports each time), for a
    command whose process is not what the test checks (a refusal before any cluster starts,
    a plan; never a kill, a signal or workers that must exit with it). ``stderr`` holds every
    record it logged, formatted as the command line prints them (a logged traceback shows as
    it would there), then what it printed."""
    from daskhps.cli import main

    assert ENV not in os.environ  # no kill point armed in this process
    capfd.readouterr()
    caplog.clear()
    code = main(list(args))
    out, err = capfd.readouterr()
    form = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    logged = "".join(f"{form.format(r)}\n" for r in caplog.records)
    return subprocess.CompletedProcess(["daskhps", *args], code, out, logged + err)


def config_checkpoint(path: Path, config: dict[str, Any]) -> Any:
    """A checkpoint object holding ``config`` (what a change policy compares) and placeholder
    values for the rest of its manifest; nothing is written to ``path``."""
    from daskhps.runfiles.checkpoint import Checkpoint

    return Checkpoint.at(
        path,
        {
            "format": 1,
            "name": path.name,
            "kind": "base",
            "passes_done": 1,
            "step": 1,
            "commit": path.name,
            "stores_dir": str(path / "stores"),
            "num_workers": 1,
            "num_shards": 1,
            "table": {},
            "config": config,
            "files": {},
        },
    )

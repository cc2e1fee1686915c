"""Several hosts on one machine, each with a disk nobody else sees: the harness of the
multi-host tests.

::

    with Hosts(tmp_path / "hosts", 4, disk=tmp_path / "disk") as hosts:
        cli("train", "run.yaml", "--set", f"cluster.address={hosts.address}")
        hosts.files(0)          # what host 0's disk holds (seen from inside its namespace)
        hosts.lose(2)           # SIGKILL its process group: the host and its disk are gone
        hosts.add_host()        # a new host, on a fresh empty disk

A ``dask scheduler`` process and one ``dask worker`` (with its nanny) per host, as
tests/_real_cluster.py starts them. Each worker process tree runs in a mount namespace of its
own (``unshare -m``) with a folder of the real disk, empty at the start and its own, mounted at
``disk``: its private local disk, whose page cache is the host's memory as on a machine (a
tmpfs of ``disk_size`` instead, for a disk that fills). With ``memory``, each host's processes
share a memory cgroup of that limit (tests/_cgroups.py): a host that outgrows it is killed by
the kernel, and its nanny starts its worker again on the same disk. The driver
(the test, or the ``daskhps`` command it starts) stays in the original namespace, where
``disk`` is an empty folder that nobody writes (a test asserts it stays empty: whatever the
driver would write there lands on no worker's disk). Everything else (logs, ``run.dir``,
``checkpoint.replicate_to``) is one file system all hosts share, as the folders a deployment
names as shared.

Hosts share the machine's network namespace and reach each other on 127.0.0.1 with their
own ports: a network namespace per host would need a bridge and addresses set up as root for
every host, and what daskhps must not assume is a shared disk, not a shared loopback. Where
mount namespaces cannot be made (not root, no ``unshare``), :func:`skip_without_namespaces`
skips the test with one line that says why.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from daskhps.runfiles.checkpoint import Checkpoint, latest_checkpoint
from tests._cgroups import MemoryCgroups, cgroups_unavailable
from tests._real_cluster import RealCluster
from tests._runs import tiny_config, write_config

__all__ = [
    "Hosts",
    "Model",
    "hosts_config",
    "model_of",
    "namespaces_unavailable",
    "same_model",
    "skip_without_namespaces",
]


@functools.cache
def namespaces_unavailable() -> str | None:
    """Why a process cannot get a disk of its own here; None when it can."""
    if shutil.which("unshare") is None:
        return "no `unshare` command (util-linux) to give each host its own mount namespace"
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs none /mnt"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["failed"])[-1]
        return f"cannot mount a private disk in a mount namespace (needs root): {why}"
    return None


def skip_without_namespaces() -> None:
    why = namespaces_unavailable()
    if why is not None:
        pytest.skip(f"multi-host harness: {why}")


class Hosts(RealCluster):
    """``n`` hosts; host ``i`` is worker process ``i`` (lost hosts keep their index).

    ``memory``: each host's memory (bytes), a cgroup limit the kernel enforces; its Dask
    ``--memory-limit`` is then 90% of it, as docs/operations.md tells an operator, unless
    ``memory_limit`` says otherwise. ``disk_size``: the disk is a tmpfs of that size (one that
    can fill) instead of a folder of the real disk.
    """

    def __init__(
        self,
        folder: Path,
        n: int,
        *,
        disk: Path,
        readonly: Path | None = None,
        memory: int | None = None,
        disk_size: str | None = None,
        **kwargs: Any,
    ) -> None:
        skip_without_namespaces()
        if memory is not None:
            why = cgroups_unavailable()
            if why is not None:
                pytest.skip(f"hosts with their own memory: {why}")
        disk.mkdir(parents=True, exist_ok=True)  # the mount point, empty on the driver's side
        # ``readonly``: a shared folder the driver can write and the hosts cannot (the bad
        # input of a path only the driver's machine can write)
        ro = (readonly,) if readonly is not None else ()
        for path in ro:
            path.mkdir(parents=True, exist_ok=True)
        self.disk = disk
        self.readonly_dir = readonly
        self.memory = memory
        self.disks = Path(folder) / "disks"  # the real disk's folders, one per host
        self.cgroups = MemoryCgroups("hosts") if memory is not None else None
        if memory is not None:
            kwargs.setdefault("memory_limit", str(int(memory * 0.9)))
            # The kernel, not the nanny, ends a host that outgrows its memory: Dask's own
            # terminate line would restart the worker first, and no machine has a nanny for
            # its RAM.
            kwargs["env"] = {"DASK_DISTRIBUTED__WORKER__MEMORY__TERMINATE": "False"}
        try:
            super().__init__(
                folder, workers=n, hide=disk, readonly=ro, hide_size=disk_size, **kwargs
            )
        except BaseException:
            if self.cgroups is not None:
                self.cgroups.close()
            raise

    def _hidden_mount(self, i: int) -> str:
        if self.hide_size is not None:
            return super()._hidden_mount(i)
        own = self.disks / f"host-{i}"
        own.mkdir(parents=True)
        return f"mount --bind {shlex.quote(str(own))} {shlex.quote(str(self.disk))}"

    def _on_host(self, i: int, argv: list[str]) -> list[str]:
        argv = super()._on_host(i, argv)
        if self.cgroups is None:
            return argv
        assert self.memory is not None
        self.cgroups.make(i, self.memory)
        return ["sh", "-c", f'{self.cgroups.join(i)} && exec "$@"', "sh", *argv]

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.cgroups is not None:
                self.cgroups.close()

    def oom_kills(self, i: int) -> int:
        """Processes of host ``i`` the kernel killed because the host ran out of memory."""
        assert self.cgroups is not None, "a host without a memory cgroup"
        return self.cgroups.oom_kills(i)

    def peak_memory(self, i: int) -> int:
        """Host ``i``'s highest memory use so far, page cache included (bytes)."""
        assert self.cgroups is not None, "a host without a memory cgroup"
        return self.cgroups.peak(i)

    def alive_hosts(self) -> list[int]:
        return [i for i, w in enumerate(self.workers) if w.poll() is None]

    def lose(self, i: int) -> None:
        """Host ``i`` is gone: its whole process group killed, its disk with it."""
        self.kill_worker(i)

    def add_host(self) -> int:
        """A new host on a fresh, empty disk; its index."""
        self.add_worker()
        return len(self.workers) - 1

    def run_on(self, i: int, *argv: str) -> str:
        """Run a command inside host ``i``'s mount namespace (it sees that host's disk)."""
        pid = self.workers[i].pid
        out = subprocess.run(
            ["nsenter", "-t", str(pid), "-m", *argv], capture_output=True, text=True, timeout=30
        )
        if out.returncode != 0:
            raise RuntimeError(f"host {i}: {' '.join(argv)}: {out.stderr.strip()}")
        return out.stdout

    def files(self, i: int, under: str = "") -> list[str]:
        """The files on host ``i``'s disk (relative to ``disk``), sorted."""
        root = os.path.join(str(self.disk), under)
        listing = self.run_on(i, "find", root, "-type", "f")
        return sorted(os.path.relpath(line, self.disk) for line in listing.splitlines())

    def driver_sees(self) -> list[str]:
        """What the driver's side of ``disk`` holds (nothing, unless the driver wrote there)."""
        return sorted(str(p.relative_to(self.disk)) for p in self.disk.rglob("*"))


# A run's model: its dense weights, and each rank's sorted keys with their rows.
Model = tuple[dict[str, torch.Tensor], list[tuple[np.ndarray, np.ndarray]]]


def stored_model(rows: Checkpoint, dense: Checkpoint | None = None) -> Model:
    """Each rank's keys and rows as ``rows``'s stores hold them at its commit, with the
    dense weights of ``dense`` (default: ``rows``'s own)."""
    ranks = []
    for r in range(rows.num_workers):
        with rows.open_store(r) as store:
            keys = store.keys().sort().values
            ranks.append((keys.numpy(), store.lookup(keys).rows.numpy()))
    return (dense or rows).dense_state(), ranks


def model_of(run_dir: Path, copy: Path) -> Model:
    """The model of a run on hosts: the dense weights of its latest checkpoint, and each
    rank's keys and rows as its copy (``checkpoint.replicate_to``) holds them at that
    checkpoint; the stores are on the hosts' disks, which the driver cannot see."""
    ckpt, copied = latest_checkpoint(run_dir), latest_checkpoint(copy)
    assert ckpt is not None and copied is not None and copied.name == ckpt.name
    return stored_model(copied, dense=ckpt)


def same_model(a: Model, b: Model) -> bool:
    """Bit for bit: every dense weight, every rank's keys and rows."""
    if a[0].keys() != b[0].keys() or not all(torch.equal(a[0][k], b[0][k]) for k in b[0]):
        return False
    return len(a[1]) == len(b[1]) and all(
        np.array_equal(ka, kb) and np.array_equal(ra, rb)
        for (ka, ra), (kb, rb) in zip(a[1], b[1], strict=True)
    )


def hosts_config(
    tmp_path: Path, logs: Path, hosts: Hosts, name: str, wait_s: float = 30, **keys: object
) -> Path:
    """A tiny run named ``name`` on ``hosts`` (its config file): its stores on the hosts' disk
    under ``name``, its copy at ``<tmp_path>/<name>-copy``, the last day held out, passes of
    300 examples, 2 restarts waiting ``wait_s`` for workers; ``keys``: more config sections."""
    cfg = tiny_config(
        tmp_path / name,
        logs,
        cluster_section={"address": hosts.address, "max_restarts": 2, "restart_wait_s": wait_s},
        **{
            "data": {"holdout": {"day": "last"}},
            "passes": {"examples_per_pass": 300},
            "table": {"tiers": {"store_dir": str(hosts.disk / name)}},
            "checkpoint": {"replicate_to": str(tmp_path / f"{name}-copy")},
            **keys,
        },
    )
    return write_config(tmp_path / f"{name}.yaml", cfg)

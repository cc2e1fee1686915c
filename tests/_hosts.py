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
own (``unshare -m``) with an empty tmpfs mounted at ``disk``: its private local disk. The driver
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
import shutil
import subprocess
from pathlib import Path

import pytest

from tests._real_cluster import RealCluster

__all__ = ["Hosts", "namespaces_unavailable", "skip_without_namespaces"]


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
    """``n`` hosts; host ``i`` is worker process ``i`` (lost hosts keep their index)."""

    def __init__(
        self,
        folder: Path,
        n: int,
        *,
        disk: Path,
        readonly: Path | None = None,
        disk_size: str = "128m",
        **kwargs: object,
    ) -> None:
        skip_without_namespaces()
        disk.mkdir(parents=True, exist_ok=True)  # the mount point, empty on the driver's side
        # ``readonly``: a shared folder the driver can write and the hosts cannot (the bad
        # input of a path only the driver's machine can write)
        ro = (readonly,) if readonly is not None else ()
        for path in ro:
            path.mkdir(parents=True, exist_ok=True)
        super().__init__(  # type: ignore[arg-type]
            folder, workers=n, hide=disk, readonly=ro, hide_size=disk_size, **kwargs
        )
        self.disk = disk
        self.readonly_dir = readonly

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

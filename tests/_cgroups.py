"""Memory cgroups for the hosts of a test: each host's processes share a memory limit that the
kernel enforces, as a machine's RAM is.

::

    with MemoryCgroups("hosts") as groups:
        groups.make(0, 1 << 30)            # host 0 may hold 1 GiB, page cache included
        argv = ["sh", "-c", f"{groups.join(0)} && exec \\"$@\\"", "sh", *command]
        groups.oom_kills(0)                # processes the kernel killed for memory
        groups.peak(0)                     # the highest usage so far

The groups sit under this process's own memory cgroup, so whatever limits the test run
still limits them. cgroup v1 (a ``memory`` hierarchy under ``/sys/fs/cgroup/memory``) and v2
(the unified hierarchy, with the memory controller enabled for children) are both handled.
Where neither can be written (not root, a container without cgroups),
:func:`cgroups_unavailable` says why, for the test to skip on.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

__all__ = ["MemoryCgroups", "cgroups_unavailable"]

ROOT = Path("/sys/fs/cgroup")


def _own_group() -> tuple[str, Path] | None:
    """("v1" or "v2", this process's memory cgroup folder), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") and (ROOT / "memory").is_dir():
            return "v1", ROOT / "memory" / path.lstrip("/")
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and (ROOT / "cgroup.controllers").exists():
            return "v2", ROOT / path.lstrip("/")
    return None


@functools.cache
def cgroups_unavailable() -> str | None:
    """Why a test cannot give its hosts memory cgroups here; None when it can."""
    own = _own_group()
    if own is None:
        return "no memory cgroup hierarchy under /sys/fs/cgroup"
    version, parent = own
    probe = parent / f"daskhps-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as e:
        return f"cannot create a memory cgroup under {parent} (needs root): {e.strerror}"
    try:
        limit = "memory.limit_in_bytes" if version == "v1" else "memory.max"
        if not (probe / limit).exists():
            return f"the memory controller is not enabled for cgroups under {parent}"
    finally:
        probe.rmdir()
    return None


def _counter(text: str, name: str) -> int:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return 0


class MemoryCgroups:
    """One memory cgroup per host, under a parent cgroup of this object's own."""

    def __init__(self, name: str) -> None:
        why = cgroups_unavailable()
        if why is not None:
            raise RuntimeError(why)
        own = _own_group()
        assert own is not None
        self.version, parent = own
        self.folder = parent / f"daskhps-{name}-{os.getpid()}-{time.monotonic_ns()}"
        self.folder.mkdir()
        if self.version == "v2":  # children of this group get the memory controller
            (self.folder / "cgroup.subtree_control").write_text("+memory")
        self.groups: dict[int, Path] = {}

    def make(self, i: int, limit: int) -> Path:
        """Host ``i``'s group, limited to ``limit`` bytes (made once)."""
        if i not in self.groups:
            group = self.folder / f"host-{i}"
            group.mkdir()
            if self.version == "v1":
                (group / "memory.limit_in_bytes").write_text(str(limit))
                (group / "memory.swappiness").write_text("0")  # as a host with no swap
            else:
                (group / "memory.max").write_text(str(limit))
                (group / "memory.swap.max").write_text("0")
            self.groups[i] = group
        return self.groups[i]

    def join(self, i: int) -> str:
        """The shell command that moves the shell running it (and what it then execs) into
        host ``i``'s group."""
        return f"echo $$ > {self.groups[i] / 'cgroup.procs'}"

    def _read(self, i: int, v1: str, v2: str) -> str:
        return (self.groups[i] / (v1 if self.version == "v1" else v2)).read_text()

    def limit(self, i: int) -> int:
        return int(self._read(i, "memory.limit_in_bytes", "memory.max"))

    def oom_kills(self, i: int) -> int:
        """Processes of host ``i`` the kernel killed for its memory limit."""
        return _counter(self._read(i, "memory.oom_control", "memory.events"), "oom_kill")

    def peak(self, i: int) -> int:
        """Host ``i``'s highest memory use so far (page cache included), in bytes."""
        return int(self._read(i, "memory.max_usage_in_bytes", "memory.peak"))

    def close(self) -> None:
        """Remove the groups; their processes must be gone (a group of a process that is
        still exiting is retried for a few seconds)."""
        deadline = time.monotonic() + 10
        for group in [*self.groups.values(), self.folder]:
            while True:
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def __enter__(self) -> MemoryCgroups:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

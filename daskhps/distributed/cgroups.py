"""The memory a worker may really use: its Dask ``memory_limit``, or less where a memory
cgroup caps its process.

Hosts often cap a worker's memory with a cgroup (a container, a systemd slice, a batch
system's job). Dask reads no cgroup but the root one (``/sys/fs/cgroup/memory/memory.
limit_in_bytes``, at import) and only for ``--memory-limit auto``; a worker started with
``--memory-limit 2GiB`` inside a 1 GiB cgroup believes it has 2 GiB. It then never pauses or
spills before the kernel's out-of-memory killer ends it: a lost host mid-pass, with the
recovery that follows, where Dask's own lines would have kept it alive. So the driver asks
each worker for its own cgroup's limit (the smallest on its path, ancestors included: a
parent's limit caps its children), sizes the run on the smaller of the two, and says, once,
which workers carry a Dask limit their cgroup will not give them.

Both cgroup versions are read: v1's ``memory`` hierarchy (``memory.limit_in_bytes``) and v2's
unified one (``memory.max``); "no limit" reads as ``None``. Where a file cannot be read (no
cgroups, another OS, a container that hides them) the worker reports ``None`` and its Dask
limit stands.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dask.utils import format_bytes

from daskhps._scheduler import scheduler_workers

__all__ = ["WorkerMemoryCap", "cgroup_memory_limit", "worker_memory_caps"]

log = logging.getLogger(__name__)

# Limits at or above this mean "none": v1 writes its "unlimited" as the largest page-aligned
# signed 64-bit value (9223372036854771712), and no host has 2**60 bytes.
_UNLIMITED = 1 << 60
# What a worker's Dask limit should be within its cgroup: Dask's own lines (spill at 60%,
# pause at 80%, terminate at 95% of the limit) then act before the kernel does, with room for
# the page cache the kernel charges to the same cgroup.
_SAFE_SHARE = 0.9


def _read_limit(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text.isdigit():  # v2's "max", or anything unexpected
        return None
    value = int(text)
    return value if 0 < value < _UNLIMITED else None


def _ancestors(path: str) -> list[str]:
    """``/a/b`` -> ``["/a/b", "/a", "/"]``."""
    out = [path or "/"]
    while out[-1] != "/":
        out.append(os.path.dirname(out[-1].rstrip("/")) or "/")
    return out


def cgroup_memory_limit(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int | None:
    """The smallest memory limit of this process's cgroups and their ancestors, in bytes;
    ``None`` when none is set or none can be read."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if "memory" in controllers.split(","):  # v1: the memory hierarchy's own mount
            files = [f"{root}/memory{p}/memory.limit_in_bytes" for p in _ancestors(path)]
        elif controllers == "":  # v2: the unified hierarchy
            files = [f"{root}{p.rstrip('/')}/memory.max" for p in _ancestors(path)]
        else:
            continue
        limits += [v for v in map(_read_limit, files) if v is not None]
    return min(limits, default=None)


@dataclass(frozen=True)
class WorkerMemoryCap:
    """One worker's memory: what Dask was told (``dask_limit``, 0 for none) and what its
    cgroup allows (``cgroup_limit``, None for no limit)."""

    address: str
    dask_limit: int
    cgroup_limit: int | None

    @property
    def limit(self) -> int:
        """What the worker can use: the smaller of the two that are set (0: unknown)."""
        known = [v for v in (self.dask_limit, self.cgroup_limit) if v]
        return min(known, default=0)

    @property
    def capped(self) -> bool:
        """Whether the cgroup gives less than Dask believes it has."""
        return self.cgroup_limit is not None and (
            not self.dask_limit or self.cgroup_limit < self.dask_limit
        )

    def line(self) -> str:
        """The warning for a capped worker: what the kernel will do and the lever."""
        assert self.cgroup_limit is not None
        told = (
            f"its Dask memory_limit of {format_bytes(self.dask_limit)}"
            if self.dask_limit
            else "no Dask memory_limit"
        )
        safe = f"{int(self.cgroup_limit * _SAFE_SHARE) >> 20}MiB"
        return (
            f"worker {self.address} runs in a memory cgroup of "
            f"{format_bytes(self.cgroup_limit)}, below {told}: the kernel kills it before "
            f"Dask pauses or spills it; start it with --memory-limit {safe} (or raise the "
            f"cgroup's limit). Sized on {format_bytes(self.cgroup_limit)}"
        )


def worker_memory_caps(
    client: Any, say: Callable[[str], None] | None = None
) -> dict[str, WorkerMemoryCap]:
    """Every worker's memory as the scheduler knows it and as its own cgroup allows, by
    address; ``say`` (default: a warning in the log) gets the line of each capped worker."""
    infos = scheduler_workers(client)
    try:
        cgroups: dict[str, int | None] = client.run(cgroup_memory_limit)
    except Exception as e:  # a worker that left between the two calls: its limit stands
        log.debug("reading the workers' cgroups failed: %s", e)
        cgroups = {}
    caps = {
        a: WorkerMemoryCap(a, int(info.get("memory_limit") or 0), cgroups.get(a))
        for a, info in infos.items()
    }
    for cap in caps.values():
        if cap.capped:
            (say or log.warning)(cap.line())
    return caps

"""A worker's memory as its cgroup allows (daskhps/distributed/cgroups.py): read from cgroup
trees on disk against a model of the rule (the smallest limit on the process's path, the
root's included), from a real memory cgroup the kernel enforces, and the driver's line for a
worker whose Dask limit its cgroup will not give."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.distributed.cgroups import WorkerMemoryCap, cgroup_memory_limit
from tests._cgroups import MemoryCgroups, cgroups_unavailable

UNLIMITED_V1 = 9223372036854771712
MiB = 1 << 20

# A level's limit file: a limit in MiB, "no limit" as each version writes it, or no file.
level = st.one_of(st.integers(1, 4096), st.just("unlimited"), st.just("absent"))


def _write_tree(root: Path, version: str, names: list[str], limits: list[object]) -> str:
    """The cgroup folders of ``names`` (root first) with ``limits``; the process's path."""
    base = root / "memory" if version == "v1" else root
    file = "memory.limit_in_bytes" if version == "v1" else "memory.max"
    folder = base
    for i, limit in enumerate(limits):
        if i:
            folder = folder / names[i - 1]
        folder.mkdir(parents=True, exist_ok=True)
        if isinstance(limit, int):
            (folder / file).write_text(f"{limit * MiB}\n")
        elif limit == "unlimited":
            (folder / file).write_text(str(UNLIMITED_V1) if version == "v1" else "max")
    return "/" + "/".join(names[: len(limits) - 1])


@settings(max_examples=150, deadline=None)
@given(
    version=st.sampled_from(["v1", "v2"]),
    limits=st.lists(level, min_size=1, max_size=5),
    data=st.data(),
)
def test_the_smallest_limit_on_the_path_counts(
    tmp_path_factory: pytest.TempPathFactory, version: str, limits: list[object], data: object
) -> None:
    tmp = tmp_path_factory.mktemp("cgroup")
    names = [f"g{i}" for i in range(len(limits) - 1)]
    path = _write_tree(tmp / "sys", version, names, limits)
    line = f"4:memory:{path}" if version == "v1" else f"0::{path}"
    other = "3:cpu,cpuacct:/elsewhere"  # another controller's line is not read
    (tmp / "cgroup").write_text(f"{other}\n{line}\n")
    expected = min((int(v) * MiB for v in limits if isinstance(v, int)), default=None)
    assert cgroup_memory_limit(str(tmp / "cgroup"), str(tmp / "sys")) == expected


def test_no_cgroup_files_reads_as_no_limit(tmp_path: Path) -> None:
    assert cgroup_memory_limit(str(tmp_path / "missing"), str(tmp_path)) is None
    (tmp_path / "cgroup").write_text("4:memory:/a\n")
    assert cgroup_memory_limit(str(tmp_path / "cgroup"), str(tmp_path / "none")) is None


def test_a_process_in_a_real_memory_cgroup_reads_its_limit() -> None:
    why = cgroups_unavailable()
    if why is not None:
        pytest.skip(why)
    probe = "from daskhps.distributed.cgroups import cgroup_memory_limit as f; print(f())"
    with MemoryCgroups("read") as groups:
        groups.make(0, 300 * MiB)
        out = subprocess.run(
            ["sh", "-c", f'{groups.join(0)} && exec "$@"', "sh", sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            check=True,
        )
    assert int(out.stdout) == 300 * MiB
    outside = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    own = cgroup_memory_limit()
    assert outside.stdout.strip() == str(own)  # this process's own group, unchanged


def test_a_worker_capped_below_its_dask_limit_is_said_with_the_lever() -> None:
    GiB = 1 << 30
    capped = WorkerMemoryCap("tcp://127.0.0.1:4000", dask_limit=2 * GiB, cgroup_limit=GiB)
    assert capped.capped and capped.limit == GiB
    line = capped.line()
    assert line.startswith("worker tcp://127.0.0.1:4000 runs in a memory cgroup of 1.00 GiB")
    assert "below its Dask memory_limit of 2.00 GiB" in line
    assert "--memory-limit 921MiB" in line and "Sized on 1.00 GiB" in line
    unlimited_dask = WorkerMemoryCap("tcp://w", dask_limit=0, cgroup_limit=GiB)
    assert unlimited_dask.capped and unlimited_dask.limit == GiB
    assert "below no Dask memory_limit" in unlimited_dask.line()
    for fine in (
        WorkerMemoryCap("tcp://w", dask_limit=GiB, cgroup_limit=2 * GiB),
        WorkerMemoryCap("tcp://w", dask_limit=GiB, cgroup_limit=None),
        WorkerMemoryCap("tcp://w", dask_limit=GiB, cgroup_limit=GiB),
    ):
        assert not fine.capped and fine.limit == GiB
    assert WorkerMemoryCap("tcp://w", dask_limit=0, cgroup_limit=None).limit == 0

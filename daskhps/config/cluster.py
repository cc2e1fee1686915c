"""The ``cluster`` section: an embedded LocalCluster (the default) or an existing scheduler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from daskhps.config._context import Ctx, size_bytes

__all__ = ["ClusterConfig"]

GPU_CHOICES = (False, True, "auto")
BACKENDS = ("auto", "gloo", "nccl")


def _memory_limit(d: dict[str, Any], ctx: Ctx) -> int | None:
    key = "cluster.memory_limit"
    value = ctx.get(d, "cluster", "memory_limit", (int, str, type(None)), None)
    if value is None or value == "auto":
        return None  # Dask's "auto": the machine's memory split evenly between workers
    value = size_bytes(ctx, key, value, "bytes (4294967296), a size ('4GiB', '500MB') or auto")
    if value < 1 << 26:
        raise ctx.error(key, f"{value} bytes is below 64 MiB; too small for a worker")
    return int(value)


@dataclass(frozen=True)
class ClusterConfig:
    """Where the workers come from.

    ``address`` connects to a running scheduler; otherwise a LocalCluster (a LocalCUDACluster
    with ``gpu``) is started with ``n_workers``, ``threads_per_worker``, ``memory_limit``
    (bytes per worker; None: Dask's auto), ``processes`` and ``dashboard_address``. The local
    settings may not be combined with ``address``. ``dist_backend`` ``auto`` is nccl on GPU
    workers and gloo otherwise; ``dist_timeout_s`` bounds every collective, so a lost worker
    fails the run instead of hanging it.
    """

    address: str | None = None
    n_workers: int = 2
    threads_per_worker: int = 1
    memory_limit: int | None = None
    processes: bool = True
    gpu: bool | str = "auto"
    dashboard_address: str = "127.0.0.1:8787"
    dist_backend: str = "auto"
    dist_timeout_s: float = 60.0

    LOCAL_KEYS: ClassVar[tuple[str, ...]] = (
        "n_workers",
        "threads_per_worker",
        "memory_limit",
        "processes",
        "dashboard_address",
    )
    KEYS: ClassVar[tuple[str, ...]] = (
        "address",
        *LOCAL_KEYS,
        "gpu",
        "dist_backend",
        "dist_timeout_s",
    )

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> ClusterConfig:
        p = "cluster"
        d = ctx.mapping(d, cls.KEYS, p)
        address = ctx.get(d, p, "address", (str, type(None)), None)
        if address is not None:
            local = [k for k in cls.LOCAL_KEYS if d.get(k) is not None]
            if local:
                raise ctx.error(
                    f"{p}.{local[0]}",
                    "applies to the embedded LocalCluster only; remove it or cluster.address "
                    f"({', '.join(cls.LOCAL_KEYS)} are local settings)",
                )
        gpu = ctx.get(d, p, "gpu", (bool, str), "auto")
        if gpu not in GPU_CHOICES:
            raise ctx.error(f"{p}.gpu", f"{gpu!r} is not allowed; choose false, true or auto")
        backend = ctx.get(d, p, "dist_backend", str, "auto", choices=BACKENDS)
        if backend == "nccl" and gpu is not True:
            raise ctx.error(f"{p}.dist_backend", "nccl needs GPU workers: set cluster.gpu: true")
        timeout = ctx.get(d, p, "dist_timeout_s", float, 60.0)
        if not timeout > 0:
            raise ctx.error(f"{p}.dist_timeout_s", f"must be > 0 seconds, got {timeout!r}")
        base = cls()
        return cls(
            address=address,
            n_workers=ctx.get(d, p, "n_workers", (int, type(None)), None, minimum=1)
            or base.n_workers,
            threads_per_worker=ctx.get(
                d, p, "threads_per_worker", (int, type(None)), None, minimum=1
            )
            or base.threads_per_worker,
            memory_limit=_memory_limit(d, ctx),
            processes=ctx.get(d, p, "processes", (bool, type(None)), None) is not False,
            gpu=gpu,
            dashboard_address=ctx.get(d, p, "dashboard_address", (str, type(None)), None)
            or base.dashboard_address,
            dist_backend=backend,
            dist_timeout_s=timeout,
        )

    @property
    def local(self) -> bool:
        """True when the run starts its own cluster."""
        return self.address is None

    def backend_for(self, has_gpu: bool) -> str:
        """The torch.distributed backend for workers with (or without) GPUs."""
        if self.dist_backend != "auto":
            return self.dist_backend
        return "nccl" if has_gpu else "gloo"

    def to_dict(self) -> dict[str, Any]:
        shared = {
            "gpu": self.gpu,
            "dist_backend": self.dist_backend,
            "dist_timeout_s": self.dist_timeout_s,
        }
        if self.address is not None:
            return {"address": self.address, **shared}
        return {
            "address": None,
            "n_workers": self.n_workers,
            "threads_per_worker": self.threads_per_worker,
            "memory_limit": self.memory_limit if self.memory_limit is not None else "auto",
            "processes": self.processes,
            "dashboard_address": self.dashboard_address,
            **shared,
        }

"""The ``cluster`` section: an embedded LocalCluster (the default) or an existing scheduler."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, model_validator

from daskhps._gpu import cuda_cluster, cuda_missing
from daskhps.options import (
    SIZE_JSON,
    Ctx,
    Int,
    Options,
    Problem,
    parse_size,
    shown,
    validate,
)

__all__ = ["ClusterConfig", "ClusterKind", "ClusterSecurity"]

# Who starts the workers: a scheduler at cluster.address, or the run's embedded cluster of CPU
# or CUDA workers.
ClusterKind = Literal["address", "local", "local-cuda"]


def _memory_limit(value: Any) -> Any:
    if value is None or value == "auto":
        return None  # Dask's "auto": the machine's memory split evenly between workers
    value = parse_size(value, "bytes (4294967296), a size ('4GiB', '500MB') or auto")
    if isinstance(value, int) and not isinstance(value, bool) and value < 1 << 26:
        raise Problem("", f"{value} bytes is below 64 MiB; too small for a worker")
    return value


def _gpu(value: Any) -> Any:
    if not (isinstance(value, bool) or value == "auto"):
        raise Problem("", f"{value!r} is not allowed; choose false, true or auto")
    return value


class ClusterSecurity(Options):
    """Dask's TLS for a ``tls://`` scheduler address: the files of this client's side (the
    scheduler and workers are started with their own, signed by the same CA)."""

    ca_file: str = Field(json_schema_extra=shown("path", "required"))
    """The CA certificate the scheduler's and workers' certificates are signed by."""
    cert_file: str = Field(json_schema_extra=shown("path", "required"))
    """This client's certificate."""
    key_file: str = Field(json_schema_extra=shown("path", "required"))
    """This client's private key."""


class ClusterConfig(Options):
    """Where the workers come from.

    ``address`` connects to a running scheduler; otherwise a LocalCluster (a LocalCUDACluster
    with ``gpu``) is started with ``n_workers``, ``threads_per_worker``, ``memory_limit``
    (bytes per worker; None: Dask's auto), ``processes`` and ``dashboard_address``. The local
    settings may not be combined with ``address``. ``dist_backend`` ``auto`` is nccl on GPU
    workers and gloo otherwise; ``dist_timeout_s`` bounds every collective, so a lost worker
    fails the run instead of hanging it.
    """

    address: str | None = None
    """Existing scheduler; null: start a LocalCluster."""
    n_workers: Int = Field(2, ge=1)
    """Local workers."""
    threads_per_worker: Int = Field(1, ge=1)
    """Threads per local worker."""
    memory_limit: Annotated[
        Int | None, BeforeValidator(_memory_limit), WithJsonSchema(SIZE_JSON)
    ] = Field(None, json_schema_extra=shown("bytes, size or `auto`", "`auto`"))
    """Per local worker (`4GiB`, `auto`)."""
    processes: bool = True
    """Local workers as processes (else threads)."""
    dashboard_address: str = Field("127.0.0.1:8787", json_schema_extra=shown("host:port"))
    """Dask dashboard of the LocalCluster."""
    gpu: Annotated[bool | Literal["auto"], BeforeValidator(_gpu)] = "auto"
    """GPU workers (LocalCUDACluster locally)."""
    dist_backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend."""
    dist_timeout_s: float = Field(60.0, gt=0.0)
    """Timeout of collectives: a lost worker fails."""
    max_restarts: Int = Field(3, ge=0)
    """Restarts from the last checkpoint after a lost worker or a failed collective; 0: fail."""
    restart_wait_s: float = Field(120.0, gt=0.0)
    """How long a restart waits for as many workers as the run had; then it re-shards onto
    those there."""
    security: ClusterSecurity | None = Field(None, json_schema_extra=shown("mapping or null"))
    """TLS files for a `tls://` address; null: none (`tcp://`)."""

    LOCAL_KEYS: ClassVar[tuple[str, ...]] = (
        "n_workers",
        "threads_per_worker",
        "memory_limit",
        "processes",
        "dashboard_address",
    )
    NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = LOCAL_KEYS

    @model_validator(mode="before")
    @classmethod
    def _local_or_address(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("address") is not None:
            local = [k for k in cls.LOCAL_KEYS if data.get(k) is not None]
            if local:
                raise Problem(
                    local[0],
                    "applies to the embedded LocalCluster only; remove it or cluster.address "
                    f"({', '.join(cls.LOCAL_KEYS)} are local settings)",
                )
        return data

    @model_validator(mode="after")
    def _tls_with_its_files(self) -> ClusterConfig:
        tls = self.address is not None and self.address.startswith("tls://")
        if tls and self.security is None:
            raise Problem(
                "security",
                f"address {self.address} is TLS: give cluster.security (ca_file, cert_file, "
                "key_file)",
            )
        if self.security is not None and not tls:
            raise Problem(
                "security",
                "applies to a tls:// cluster.address only (the embedded cluster stays on "
                "this machine)",
            )
        return self

    @model_validator(mode="after")
    def _nccl_needs_gpus(self) -> ClusterConfig:
        if self.dist_backend == "nccl" and self.gpu is not True:
            raise Problem("dist_backend", "nccl needs GPU workers: set cluster.gpu: true")
        return self

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> ClusterConfig:
        if "cluster.address" in ctx.overridden and isinstance(d, Mapping) and d.get("address"):
            # `--set cluster.address=...` points a config written for the embedded cluster at
            # a running one: the file's local settings are set aside, not an error (settings
            # given with --set too are still refused beside the address).
            keep = {f"cluster.{k}" for k in cls.LOCAL_KEYS} & ctx.overridden
            d = {k: v for k, v in d.items() if k not in cls.LOCAL_KEYS or f"cluster.{k}" in keep}
        return validate(cls, d, ctx, "cluster")

    @property
    def local(self) -> bool:
        """True when the run starts its own cluster."""
        return self.address is None

    def kind(self) -> ClusterKind:
        """Who starts the workers; ``gpu: auto`` asks this machine whether it has CUDA."""
        if not self.local:
            return "address"
        return "local-cuda" if cuda_cluster(self.gpu) else "local"

    def lacks_cuda(self) -> bool:
        """Whether the embedded cluster asks for CUDA workers this machine cannot run."""
        return self.local and cuda_missing(self.gpu)

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
            "max_restarts": self.max_restarts,
            "restart_wait_s": self.restart_wait_s,
            "security": None if self.security is None else self.security.to_dict(),
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

""":func:`~daskhps.distributed.start_cluster`'s arguments from a run's config (``cluster.*``,
``storage.options``): training, its rollback checks and ``daskhps predict`` start or connect
their cluster alike, so a scheduler's TLS files and the storage options reach every one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daskhps.config import RunConfig

__all__ = ["cluster_args"]


def cluster_args(config: RunConfig) -> dict[str, Any]:
    """The arguments of :func:`~daskhps.distributed.start_cluster` for ``config``."""
    c = config.cluster
    return {
        "address": c.address,
        "n_workers": c.n_workers if c.local else None,
        "threads_per_worker": c.threads_per_worker,
        "memory_limit": c.memory_limit if c.memory_limit is not None else "auto",
        "processes": c.processes,
        "gpus": c.gpu if c.gpu in (True, False, "auto") else "auto",
        "dashboard_address": c.dashboard_address,
        "security": c.security,
        "storage_options": config.storage.options,
    }

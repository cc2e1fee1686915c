"""The distributed layer: cluster, worker-resident shards, process group, embedding exchange.

Only this package (with ``train`` and the CLI) imports dask; the table, tiers and models do
not. In data-flow order:

* :func:`start_cluster` — an embedded LocalCluster / LocalCUDACluster or a scheduler address;
* :class:`ShardHost` — the worker plugin holding each worker's table shards and their locks;
* :func:`init_comm` — one explicit torch.distributed group over the workers per run;
* :class:`Exchange` — per-mini-batch keys, rows and gradients between ranks.
"""

from __future__ import annotations

from daskhps.distributed._errors import ClusterError, CommError, WorkerLostError
from daskhps.distributed._pinned import run_pinned
from daskhps.distributed.cluster import ClusterHandle, cuda_available, start_cluster
from daskhps.distributed.comm import Comm, CommGroup, init_comm, local_comm
from daskhps.distributed.exchange import Exchange, Routing
from daskhps.distributed.plugin import (
    ShardHost,
    close_shards,
    commit_shards,
    flush_shards,
    local_shards,
    open_shards,
    shard_stats,
    stage_shards,
    try_stage_shards,
)
from daskhps.distributed.sizing import MAX_CPU_FRACTION, TierSizing

__all__ = [
    "MAX_CPU_FRACTION",
    "ClusterError",
    "ClusterHandle",
    "Comm",
    "CommError",
    "CommGroup",
    "Exchange",
    "Routing",
    "ShardHost",
    "TierSizing",
    "WorkerLostError",
    "close_shards",
    "commit_shards",
    "cuda_available",
    "flush_shards",
    "init_comm",
    "local_comm",
    "local_shards",
    "open_shards",
    "run_pinned",
    "shard_stats",
    "stage_shards",
    "start_cluster",
    "try_stage_shards",
]

"""The distributed layer: cluster, worker-resident shards, process group, embedding exchange.

Only this package (with ``train`` and the CLI) imports dask; the table, tiers and models do
not. In data-flow order:

* :func:`start_cluster` — an embedded LocalCluster / LocalCUDACluster or a scheduler address;
* :class:`RunGroup` — one run's hosts on the workers (:class:`RunHost`: the rank's process
  group, its table shards (:class:`WorkerShards`) and dense replica), and the one way to run a
  function on every rank;
* :class:`Comm` — one rank's explicit torch.distributed group, formed through Dask by
  :mod:`daskhps.distributed.rendezvous`;
* :class:`Exchange` — per-mini-batch keys, rows and gradients between ranks (packed to each
  key's width when tables differ, :class:`KeyWidths`);
* :func:`reshard_on_workers` — a checkpoint's stores onto another worker count, the rows
  moving worker to worker.
"""

from __future__ import annotations

from daskhps._gpu import cuda_available
from daskhps.distributed._errors import (
    ClusterError,
    CommError,
    WaitStopped,
    WorkerLostError,
    WorkerPausedError,
)
from daskhps.distributed._pinned import run_pinned, stop_waits_when
from daskhps.distributed.cluster import ClusterHandle, start_cluster
from daskhps.distributed.collective import Comm
from daskhps.distributed.exchange import Exchange, Routing
from daskhps.distributed.host import RunGroup, RunHost, local_host
from daskhps.distributed.pass_end import PassEnd, end_pass
from daskhps.distributed.reshard import ReshardReport, reshard_on_workers
from daskhps.distributed.shards import StageAhead, WorkerShards
from daskhps.distributed.widths import KeyWidths
from daskhps.tier_sizing import TierSizing  # what WorkerShards is sized by

__all__ = [
    "ClusterError",
    "ClusterHandle",
    "Comm",
    "CommError",
    "Exchange",
    "KeyWidths",
    "PassEnd",
    "ReshardReport",
    "Routing",
    "RunGroup",
    "RunHost",
    "StageAhead",
    "TierSizing",
    "WaitStopped",
    "WorkerLostError",
    "WorkerPausedError",
    "WorkerShards",
    "cuda_available",
    "end_pass",
    "local_host",
    "reshard_on_workers",
    "run_pinned",
    "start_cluster",
    "stop_waits_when",
]

"""Functions the Dask tests run on workers (importable, so worker processes find them)."""

from __future__ import annotations

import os
import time

import torch

from daskhps.distributed import Exchange, RunHost
from daskhps.sharding import ShardMap

TABLE = "emb"
NUM_SHARDS = 8


def all_reduce(host: RunHost) -> list[float]:
    comm = host.require_comm()
    t = torch.full((3,), float(comm.rank + 1))
    comm.all_reduce(t)
    return t.tolist()


def exchange(host: RunHost, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pull this rank's batch from the owners' shards; push ones back; the batch's rows."""
    comm, shards = host.require_comm(), host.require_shards()
    ex = Exchange(comm, ShardMap(NUM_SHARDS, comm.world_size))
    routing = ex.route(keys)
    rows = ex.pull_rows(routing, lambda k: shards.lookup(TABLE, k))
    ones = torch.ones_like(rows)
    ex.push_grads(routing, ones, lambda k, g: shards.apply_gradients(TABLE, k, g))
    return keys, rows[routing.inverse]


def die_in_collective(host: RunHost) -> None:
    """Rank 1's process dies while rank 0 waits in an all-reduce."""
    comm = host.require_comm()
    if comm.rank == 1:
        time.sleep(0.5)
        os._exit(1)
    comm.all_reduce(torch.ones(1))


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def die_or_sleep(rank: int) -> None:
    """Rank 1's process dies outside any collective; rank 0 keeps working for a while."""
    if rank == 1:
        time.sleep(0.3)
        os._exit(1)
    time.sleep(8.0)


def slow_len(values: object, seconds: float) -> int:
    """``len(values)`` after ``seconds``: long enough for the caller to poll a few times."""
    time.sleep(seconds)
    return len(values)  # type: ignore[arg-type]


def held_keys(dask_worker: object = None) -> list[str]:
    return [str(k) for k in dask_worker.data]  # type: ignore[attr-defined]


def big_ones(n: int) -> torch.Tensor:
    """A result big enough that fetching it takes a real transfer."""
    return torch.ones(n)

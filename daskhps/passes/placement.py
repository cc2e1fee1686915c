"""Frames of one partition per worker, each partition built on the worker that owns it.

::

    read p0 -> split -+-> piece of p0 for 0 --+
                      +-> piece of p0 for 1 --|--+
    read p1 -> split -+-> piece of p1 for 0 --+  |--> [concat -> finish] on worker 0
                      +-> piece of p1 for 1 -----+--> [concat -> finish] on worker 1
    |<----- where the scheduler likes ----->|    |<--- pinned to the owner --->|

A task is pinned to worker ``w`` when only worker ``w``'s partitions depend on it and all it
reads are such tasks too: the shuffle's output concat and every step after it. Everything
else runs where the scheduler likes; a task that takes one worker's piece out of a shared
split runs where the split is, so only the piece travels. Each piece of the shuffle thus
crosses the network once, straight to its owner, and the finished partition never moves.

The pinned tasks reach the scheduler as graph layers annotated ``workers=[address],
allow_other_workers=False`` (one layer per worker) through ``Client.get``: ``Client.compute``
and ``Client.persist`` only take one restriction for a whole computation.

Dask's p2p shuffle chooses the worker of each output partition itself (rotating the workers
from one shuffle to the next) and reschedules a restricted output task onto its choice, so a
p2p output lands on its owner only by chance. Pinning the steps after it would then fetch
the shuffle's output before they shrink it (the keys' global dedup: 12 MiB instead of 4.7 for
a pass of 100k rows), so those steps run where p2p put the data and the finished partition
is copied to its owner by one pinned task (which moves nothing when p2p chose the owner).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from graphlib import TopologicalSorter
from typing import Any

import dask.dataframe as dd
from dask._task_spec import convert_legacy_graph
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from daskhps.passes.owners import worker_addresses

__all__ = ["OwnerPlacement", "owner_tasks", "place_on_workers", "place_together"]

# The key of a p2p shuffle's barrier task, which every output partition of the shuffle reads
# (p2p itself finds its barrier by this name).
_P2P_BARRIER = "shuffle-barrier-"


@dataclass(frozen=True)
class OwnerPlacement:
    """Each worker's keys held on that worker: ``futures[w]`` lives on ``addresses[w]``."""

    futures: tuple[Any, ...]
    addresses: tuple[str, ...]


def owner_tasks(graph: Mapping[Any, Any], outputs: Sequence[Sequence[Any]]) -> dict[Any, int]:
    """``{key: rank}`` of the tasks of ``graph`` to run on their rank's worker.

    ``outputs[f][w]`` is the key of frame ``f``'s partition ``w``, owned by rank ``w``. A task
    is pinned to rank ``w`` when only rank ``w``'s partitions depend on it and every key it
    reads is pinned to rank ``w`` as well; keys computed before ``graph`` count as shared.
    Nothing after a p2p shuffle is pinned: p2p places its outputs itself.
    """
    deps = {k: frozenset(t.dependencies) for k, t in convert_legacy_graph(dict(graph)).items()}
    order = tuple(k for k in TopologicalSorter(deps).static_order() if k in deps)
    after_p2p: set[Any] = set()
    for key in order:  # dependencies first
        if any(d in after_p2p or _is_p2p_barrier(d) for d in deps[key]):
            after_p2p.add(key)
    ranks = dict.fromkeys(deps, 0)  # bit w set: a partition of rank w depends on the task
    for frame in outputs:
        for w, key in enumerate(frame):
            ranks[key] |= 1 << w
    for key in reversed(order):  # dependents first: a task's bits are complete when reached
        for d in deps[key]:
            if d in ranks:
                ranks[d] |= ranks[key]
    one_rank = {k: m for k, m in ranks.items() if m and not m & (m - 1) and k not in after_p2p}
    return {
        key: mask.bit_length() - 1
        for key, mask in one_rank.items()
        if all(ranks.get(d) == mask for d in deps[key])
    }


def _is_p2p_barrier(key: Any) -> bool:
    return isinstance(key, str) and key.startswith(_P2P_BARRIER)


def _identity(df: Any) -> Any:
    return df


def place_on_workers(
    client: Any, owned: dd.DataFrame, addresses: Sequence[str] | None = None
) -> OwnerPlacement:
    """Compute :func:`~daskhps.passes.owner_keys` output (or any frame of one partition per
    worker) with partition ``w`` on worker ``w``."""
    (placed,) = place_together(client, [owned], addresses)
    return placed


def place_together(
    client: Any, frames: Sequence[dd.DataFrame], addresses: Sequence[str] | None = None
) -> list[OwnerPlacement]:
    """:func:`place_on_workers` of several frames in one computation, so the tasks they share
    (reading a pass's partitions) run once."""
    addresses = list(addresses or worker_addresses(client))
    for owned in frames:
        if owned.npartitions != len(addresses):
            raise ValueError(
                f"{owned.npartitions} owner partitions for {len(addresses)} workers; build the "
                "shard map with num_workers equal to the number of workers"
            )
    graph: dict[Any, Any] = {}
    outputs = []
    for owned in frames:
        optimized = owned.optimize()
        graph.update(optimized.__dask_graph__())
        outputs.append(list(optimized.__dask_keys__()))
    pinned = owner_tasks(graph, outputs)
    shared: dict[Any, Any] = {}
    by_rank: list[dict[Any, Any]] = [{} for _ in addresses]
    for key, task in graph.items():
        (by_rank[pinned[key]] if key in pinned else shared)[key] = task
    layers = {"owner-shared": MaterializedLayer(shared)}
    for w, (address, tasks) in enumerate(zip(addresses, by_rank, strict=True)):
        restriction = {"workers": [address], "allow_other_workers": False}
        layers[f"owner-{w}"] = MaterializedLayer(tasks, annotations=restriction)
    hlg = HighLevelGraph(layers, dependencies={name: set() for name in layers})
    # One future per partition, in partition order (the nested key lists come back as such).
    computed = client.get(hlg, outputs, sync=False)
    placements = []
    for keys, futures in zip(outputs, computed, strict=True):
        placed = tuple(
            future
            if key in pinned
            else client.submit(  # only after p2p: copied from where p2p put it
                _identity, future, workers=[address], allow_other_workers=False, pure=False
            )
            for key, future, address in zip(keys, futures, addresses, strict=True)
        )
        placements.append(OwnerPlacement(placed, tuple(addresses)))
    del computed  # the copies keep what they still need
    return placements

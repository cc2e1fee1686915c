"""Rank program of the packed-exchange tests (module level, so spawn can import it).

Keys of three tables of different widths go through a real group; every rank and the test's
reference derive the same batches, rows and gradients from the seed and the keys alone.
Rows and gradients hold small integers, so sums are exact in any order; beyond a key's width
they hold junk that must never arrive anywhere.
"""

from __future__ import annotations

from pathlib import Path

import torch

from daskhps.data.keyspace import TABLE_SHIFT
from daskhps.distributed import Comm, Exchange, KeyWidths
from daskhps.distributed.exchange import ApplyFn
from daskhps.sharding import ShardMap

NUM_SHARDS = 8
DIMS = (5, 2, 3)  # table index -> row width
WIDEST = max(DIMS)
LOW = (1 << TABLE_SHIFT) - 1
JUNK = 1000.0  # beyond a key's width, in what lookups and gradients hand the exchange


def tagged(table: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    return (table << TABLE_SHIFT) | low


def rounds(world: int) -> list[list[torch.Tensor]]:
    """Batches of every rank, round by round: keys shared across ranks, then each rank's own
    key range, then an uneven round where rank 1 owns none of the keys and the last rank
    asks for nothing."""
    g = torch.Generator().manual_seed(11)

    def draw(n: int, lo: int, hi: int) -> torch.Tensor:
        return tagged(
            torch.randint(0, len(DIMS), (n,), generator=g), torch.randint(lo, hi, (n,), generator=g)
        )

    shared = [draw(200, 0, 60) for _ in range(world)]
    own = [draw(150, r * 1000, r * 1000 + 100) for r in range(world)]
    owner = ShardMap(NUM_SHARDS, world).worker
    uneven = []
    for r in range(world):
        keys = draw(120, 0, 400)
        keys = keys[owner(keys) != 1]
        uneven.append(keys[:0] if r == world - 1 else keys)
    return [shared, own, uneven]


def _junk_beyond(keys: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    width = torch.tensor(DIMS)[keys >> TABLE_SHIFT]
    return torch.where(torch.arange(WIDEST) < width[:, None], rows, JUNK)


def lookup(keys: torch.Tensor) -> torch.Tensor:
    """An owner's rows: ``(low % 13) + 16 table + column``, junk beyond the width."""
    base = (keys & LOW) % 13 + 16 * (keys >> TABLE_SHIFT)
    return _junk_beyond(keys, (base[:, None] + torch.arange(WIDEST)).to(torch.float32))


def grads_for(keys: torch.Tensor, rank: int) -> torch.Tensor:
    """A requester's gradients, ``((low % 11) + column + 1) (rank + 1)``, junk beyond."""
    base = (keys & LOW) % 11 + 1
    rows = (base[:, None] + torch.arange(WIDEST)) * (rank + 1)
    return _junk_beyond(keys, rows.to(torch.float32))


def _keep(into: list[tuple[torch.Tensor, torch.Tensor]]) -> ApplyFn:
    """An ``apply_fn`` that keeps every call's keys and gradients."""
    return lambda keys, grads: into.append((keys, grads.clone()))


def run_packed(rank: int, world: int, root: str) -> None:
    """Route, pull and push every round with packed widths, and once more with one table
    through both exchanges; save what this rank saw, applied and counted."""
    root_p = Path(root)
    comm = Comm.create(rank, world, init_method=f"file://{root_p / 'store'}", timeout_s=30)
    shards = ShardMap(NUM_SHARDS, world)
    ex = Exchange(comm, shards, KeyWidths(DIMS))
    steps = []
    for batch in rounds(world):
        applied: list[tuple[torch.Tensor, torch.Tensor]] = []
        comm.traffic.take()
        routing = ex.route(batch[rank])
        comm.traffic.take()
        rows = ex.pull_rows(routing, lookup)
        pulled = comm.traffic.take()
        ex.push_grads(routing, grads_for(routing.keys, rank), _keep(applied))
        pushed = comm.traffic.take()
        steps.append(
            {
                "keys": routing.keys,
                "owned": routing.owned,
                "send": routing.send_counts,
                "recv": routing.recv_counts,
                "seen": rows[routing.inverse],
                "applied": applied,
                "pull": pulled,
                "push": pushed,
            }
        )

    # One table: the packed exchange and the plain one are the same, bit and byte.
    one = []
    for ex1 in (Exchange(comm, shards), Exchange(comm, shards, KeyWidths([3]))):
        keys = rounds(world)[0][rank] & LOW
        comm.traffic.take()
        routing = ex1.route(keys)
        rows = ex1.pull_rows(
            routing, lambda k: torch.sin(k.to(torch.float32)[:, None] + torch.arange(3))
        )
        got: list[tuple[torch.Tensor, torch.Tensor]] = []
        ex1.push_grads(routing, torch.cos(rows), _keep(got))
        one.append({"seen": rows[routing.inverse], "applied": got, "traffic": comm.traffic.take()})
    comm.close()
    torch.save({"steps": steps, "one": one}, root_p / f"packed-{rank}.pt")

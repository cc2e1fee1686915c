"""Rank programs of the multi-process exchange tests (module level, so spawn can import them).

Every rank (and the single-process reference in the test) derives the same batches and
gradients from the seed, so the reference can replay them in one process.
"""

from __future__ import annotations

from pathlib import Path

import torch

from daskhps.distributed import Comm, Exchange
from daskhps.sharding import ShardMap
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec

NUM_SHARDS = 8
SPEC = TableSpec("emb", dim=8, optimizer=OptimizerSpec(kind="sgd", lr=0.5), seed=3)


def rounds(world: int, disjoint: bool) -> list[list[torch.Tensor]]:
    """Batches of every rank, round by round; the last round is uneven: rank 1 owns none of
    the keys and the last rank sends none."""
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(2):
        if disjoint:  # each rank draws from its own key range: no key is shared
            batch = [
                torch.randint(r * 10_000, r * 10_000 + 400, (300,), generator=g)
                for r in range(world)
            ]
        else:  # a small shared pool: duplicates within and across ranks
            batch = [torch.randint(0, 500, (300,), generator=g) for _ in range(world)]
        out.append(batch)
    owner = ShardMap(NUM_SHARDS, world).worker
    uneven = []
    for r in range(world):
        keys = torch.randint(0, 500, (200,), generator=g) + (r * 10_000 if disjoint else 0)
        keys = keys[owner(keys) != 1]
        uneven.append(keys[:0] if r == world - 1 else keys)
    out.append(uneven)
    return out


def grads_for(keys: torch.Tensor, rank: int) -> torch.Tensor:
    """A gradient row per key that also depends on the sending rank."""
    base = torch.arange(SPEC.dim, dtype=torch.float32)
    return torch.sin(keys.to(torch.float32)[:, None] * 0.37 + base) * (rank + 1) * 0.1


def run_exchange(rank: int, world: int, root: str, disjoint: bool) -> None:
    """Pull and push every round through a real gloo group; save what this rank saw."""
    root_p = Path(root)
    comm = Comm.create(rank, world, init_method=f"file://{root_p / 'store'}", timeout_s=30)
    ex = Exchange(comm, ShardMap(NUM_SHARDS, world))
    seen = []
    with EmbeddingTable.open(SPEC, root_p / f"rank-{rank}", device_rows=5000) as table:
        for batch in rounds(world, disjoint):
            keys = batch[rank]
            routing = ex.route(keys)
            rows = ex.pull_rows(routing, table.lookup)
            seen.append(rows[routing.inverse])
            ex.push_grads(routing, grads_for(routing.keys, rank), table.apply_gradients)
        every = torch.unique(torch.cat([k for batch in rounds(world, disjoint) for k in batch]))
        mine = every[ShardMap(NUM_SHARDS, world).worker(every) == rank]
        final = table.lookup(mine, read_only=True)
        # Dense gradients: rank-dependent values, summed across ranks in one bucket.
        model = torch.nn.Linear(3, 2)
        for i, p in enumerate(model.parameters()):
            p.grad = torch.full_like(p, float(rank + 1) * (i + 1))
        ex.allreduce_dense(model)
        dense = [p.grad.clone() for p in model.parameters()]
        table.commit("end")
    comm.close()
    torch.save(
        {"seen": seen, "keys": mine, "final": final, "dense": dense}, root_p / f"out-{rank}.pt"
    )


def run_nccl(rank: int, world: int, root: str) -> None:
    """An all-reduce and an uneven all-to-all over nccl, one GPU per rank."""
    device = torch.device("cuda", rank)
    comm = Comm.create(rank, world, init_method=f"file://{root}/store", device=device)
    t = torch.full((4,), float(rank + 1), device=device)
    comm.all_reduce(t)
    send = [rank + 1] * world  # rank r sends r + 1 rows to everyone
    recv = [r + 1 for r in range(world)]
    out = torch.empty(sum(recv), device=device)
    comm.all_to_all_single(out, torch.full((sum(send),), float(rank), device=device), recv, send)
    comm.close()
    torch.save({"sum": t.cpu(), "got": out.cpu()}, Path(root) / f"nccl-{rank}.pt")


def traffic_batches(world: int, rank: int) -> list[torch.Tensor]:
    """Batches of random sizes and key ranges (seeded by rank), an empty one, and one of keys
    this rank owns itself only (nothing of it may count)."""
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(6):
        size = int(torch.randint(1, 400, (1,), generator=g))
        pool = int(torch.randint(50, 5000, (1,), generator=g))
        out.append(torch.randint(0, pool, (size,), generator=g))
    out.append(torch.zeros(0, dtype=torch.int64))
    keys = torch.arange(10_000)
    out.append(keys[ShardMap(NUM_SHARDS, world).worker(keys) == rank][:300])
    return out


def run_traffic(rank: int, world: int, root: str) -> None:
    """Route, pull, push and all-reduce every batch of :func:`traffic_batches` through a real
    gloo group; save, per batch, the routing's split counts and what ``comm.traffic`` counted
    for each step."""
    root_p = Path(root)
    comm = Comm.create(rank, world, init_method=f"file://{root_p / 'store'}", timeout_s=30)
    ex = Exchange(comm, ShardMap(NUM_SHARDS, world))
    model = torch.nn.Linear(5, 3)
    steps = []
    with EmbeddingTable.open(SPEC, root_p / f"rank-{rank}", device_rows=20_000) as table:
        for keys in traffic_batches(world, rank):
            comm.traffic.take()
            routing = ex.route(keys)
            routed = comm.traffic.take()
            rows = ex.pull_rows(routing, table.lookup)
            pulled = comm.traffic.take()
            ex.push_grads(routing, torch.ones_like(rows), table.apply_gradients)
            pushed = comm.traffic.take()
            for p in model.parameters():
                p.grad = torch.ones_like(p)
            ex.allreduce_dense(model)
            reduced = comm.traffic.take()
            steps.append(
                {
                    "send": routing.send_counts,
                    "recv": routing.recv_counts,
                    "route": routed,
                    "pull": pulled,
                    "push": pushed,
                    "dense": reduced,
                }
            )
        table.commit("end")
    comm.close()
    torch.save(steps, root_p / f"traffic-{rank}.pt")

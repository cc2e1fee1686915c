"""Latency of one exchange round (route + pull + push) over a real gloo group.

    python -m tests.distributed.bench_exchange --ranks 2 --keys 4096 --dim 16

Each rank owns a real ``EmbeddingTable`` shard with its keys staged, draws ``--keys`` unique
keys per batch, and times route (counts + keys all-to-all), pull (owner lookups + rows back)
and push (gradients to owners + SGD update). One torch thread per rank. Prints JSON.

``--widths 16,4`` spreads the keys over tables of those row widths (table ``i % n`` for the
``i``-th key) and sends rows packed (:class:`~daskhps.distributed.KeyWidths`); owners answer
with zeros, as with ``--comm-only``, since one table cannot hold rows of several widths.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from daskhps.data.keyspace import TABLE_SHIFT
from daskhps.distributed import Comm, Exchange, KeyWidths
from daskhps.sharding import ShardMap
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec


def _rank(rank: int, args: argparse.Namespace, root: str) -> None:
    torch.set_num_threads(1)
    world = args.ranks
    comm = Comm.create(rank, world, init_method=f"file://{root}/store", timeout_s=60)
    widths = KeyWidths(args.widths) if args.widths else None
    ex = Exchange(comm, ShardMap(64, world), widths)
    dim = widths.widest if widths else args.dim
    spec = TableSpec("bench", dim=dim, optimizer=OptimizerSpec(kind="sgd"))
    g = torch.Generator().manual_seed(rank)
    pool = 1_000_000
    batches = [torch.randperm(pool, generator=g)[: args.keys] for _ in range(args.batches)]
    if widths:  # tag the i-th key with table i % n
        tags = torch.arange(args.keys) % len(widths.dims)
        batches = [(tags[: len(b)] << TABLE_SHIFT) | b for b in batches]
    times: dict[str, list[float]] = {"route": [], "pull": [], "push": [], "round": []}
    with EmbeddingTable.open(spec, Path(root) / f"rank-{rank}", device_rows=pool) as table:
        mine = torch.arange(pool)
        table.stage(mine[ex.shard_map.worker(mine) == rank])  # rows resident, as in a pass
        lookup, apply = table.lookup, table.apply_gradients
        if args.comm_only or widths:  # the collectives alone: owners answer with zeros
            lookup, apply = (lambda k: torch.zeros(len(k), dim)), (lambda k, g: None)
        for i, keys in enumerate(batches):
            comm.barrier()
            t0 = time.perf_counter()
            routing = ex.route(keys)
            t1 = time.perf_counter()
            rows = ex.pull_rows(routing, lookup)
            t2 = time.perf_counter()
            ex.push_grads(routing, torch.ones_like(rows), apply)
            t3 = time.perf_counter()
            if i >= args.warmup:
                for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2, t3 - t0), strict=True):
                    times[k].append(1e3 * v)
        table.unpin()
        table.commit("bench")  # keeps the close quiet; the store is thrown away anyway
    comm.close()
    if rank == 0:
        out = {k: round(statistics.median(v), 3) for k, v in times.items()}
        what = "collectives only" if args.comm_only else "with table lookups and SGD updates"
        if widths:
            what = f"collectives only, rows packed to widths {list(widths.dims)}"
        report = {"ranks": world, "keys": args.keys, "dim": dim, "what": what, "median_ms": out}
        print(json.dumps(report))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--keys", type=int, default=4096)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--comm-only", action="store_true", help="owners answer with zeros")
    p.add_argument(
        "--widths",
        type=lambda v: [int(w) for w in v.split(",")],
        help="row widths of several tables, e.g. 16,4: keys spread over them, rows packed",
    )
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as root:
        mp.spawn(_rank, args=(args, root), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()

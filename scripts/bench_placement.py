"""Benchmark preparing a pass: route its keys and examples to their workers and place them.

    python scripts/bench_placement.py [--json] [--rows N] [--parts P] [--workers W]
                                      [--shuffles p2p,tasks] [--repeat R] [--out DIR]

Generates a log of ``--rows`` rows in ``--parts`` files and plans it as one pass for
``--workers`` worker processes of a LocalCluster (one thread each). Each run reads the pass's
partitions (persisted, not timed), then times what the trainer does next: route the pass's
keys to their owners (``owner_keys``) and its examples to the workers that train them
(``route_examples``), and place both, until every partition is on its worker.

The figure is the median seconds of ``place_together`` (each partition computed on its owner)
against the former placement, the baseline (computed wherever the scheduler liked, then copied
to its owner by one pinned task per partition), runs interleaved; ``ratio`` below 1 is faster.
Each record also gives the bytes the workers fetched from each other while placing, and the
load average before and after (the machines these run on are shared).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
from distributed import Client, LocalCluster, wait

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter

from daskhps.data import ClickLog, read_click_log
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.passes import (
    PassConfig,
    PassPlan,
    build_plan,
    owner_keys,
    pass_keys,
    place_together,
)
from daskhps.passes.keys import pass_partitions
from daskhps.passes.placement import OwnerPlacement
from daskhps.sharding import ShardMap
from daskhps.training.examples import route_examples

Place = Callable[[Any, Sequence[Any], Sequence[str]], list[OwnerPlacement]]


def _identity(df: Any) -> Any:
    return df


def copy_to_owners(
    client: Any, frames: Sequence[Any], addresses: Sequence[str]
) -> list[OwnerPlacement]:
    """The former placement (the baseline): compute the partitions wherever the scheduler
    likes, then pull partition w onto worker w with one pinned task each."""
    parts = client.compute([d for f in frames for d in f.to_delayed()])
    W = len(addresses)
    out = []
    for i in range(len(frames)):
        pinned = tuple(
            client.submit(_identity, part, workers=[addr], allow_other_workers=False, pure=False)
            for part, addr in zip(parts[i * W : (i + 1) * W], addresses, strict=True)
        )
        out.append(OwnerPlacement(pinned, tuple(addresses)))
    return out


def _fetched_bytes(client: Client) -> int:
    logs = client.run(lambda dask_worker: list(dask_worker.transfer_incoming_log))
    return sum(sum(e["keys"].values()) for log in logs.values() for e in log)


def _clear_fetch_logs(client: Client) -> None:
    client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())


@dataclass(frozen=True)
class OnePass:
    """The first pass of a plan of ``log`` and how it is routed."""

    log: ClickLog
    plan: PassPlan
    shard_map: ShardMap
    method: str
    addresses: Sequence[str]


def prepare(client: Client, p: OnePass, place: Place) -> tuple[float, int]:
    """Seconds to route and place the pass once its partitions are read, and the bytes the
    workers fetched from each other meanwhile (the trainer's ``_prepare``, timed)."""
    spec = p.plan.passes[0]
    where, lengths, offset = pass_partitions(p.plan.partition_lengths, spec.start, spec.stop)
    start, stop = spec.start - offset, spec.stop - offset
    rows = dataclasses.replace(p.log, frame=p.log.frame.partitions[where].persist())
    wait(rows.frame)
    _clear_fetch_logs(client)
    t0 = time.perf_counter()
    with dask.config.set({"dataframe.shuffle.method": p.method}):  # the examples' shuffle
        owned = owner_keys(pass_keys(rows, lengths, start, stop), p.shard_map, p.method)
        routed = route_examples(
            rows.frame,
            lengths,
            start,
            stop,
            batch_size=spec.global_batch_size,
            num_workers=len(p.addresses),
            order=spec.order() - offset,
        )
        placed = place(client, [owned, routed], p.addresses)
        wait([f for pl in placed for f in pl.futures])
    return time.perf_counter() - t0, _fetched_bytes(client)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000, help="rows of the log (one pass)")
    ap.add_argument("--parts", type=int, default=8, help="files (Dask partitions)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shuffles", default="p2p,tasks", help="Dask shuffle methods, in order")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--memory-limit", default="3GiB", help="per worker (default 3GiB)")
    ap.add_argument("--out", default=None, help="folder for the generated log (default: temp)")
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    args = ap.parse_args()
    rep = Reporter(args.json)

    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            memory_limit=args.memory_limit,
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        out = Path(args.out or tmp)
        generate(GeneratorConfig(rows_per_day=args.rows, parts_per_day=args.parts, seed=0), out)
        log = read_click_log(str(out))
        addresses = sorted(client.scheduler_info()["workers"])
        for method in args.shuffles.split(","):
            cfg = PassConfig(
                examples_per_pass=args.rows,
                global_batch_size=1000 * args.workers,
                shuffle_examples=True,
                shuffle_method=method,
            )
            plan = build_plan(log, cfg, num_workers=args.workers)
            one = OnePass(log, plan, ShardMap(64, args.workers), method, addresses)
            runs: dict[str, list[tuple[float, int]]] = {"one hop": [], "copied": []}
            load_before = os.getloadavg()
            prepare(client, one, place_together)  # warm-up: imports, the first shuffle
            for _ in range(args.repeat):
                runs["one hop"].append(prepare(client, one, place_together))
                runs["copied"].append(prepare(client, one, copy_to_owners))
            load_after = os.getloadavg()
            med = {k: statistics.median(s for s, _ in v) for k, v in runs.items()}
            fetched = {k: statistics.median(b for _, b in v) for k, v in runs.items()}
            rep.emit(
                f"prepare a pass, {method} shuffle: route + place on owners",
                med["one hop"],
                "s",
                baseline=med["copied"],
                baseline_name="computed anywhere, then copied to the owner",
                seconds=[round(s, 3) for s, _ in runs["one hop"]],
                baseline_seconds=[round(s, 3) for s, _ in runs["copied"]],
                fetched_mib=round(fetched["one hop"] / 2**20, 2),
                baseline_fetched_mib=round(fetched["copied"] / 2**20, 2),
                rows=args.rows,
                parts=args.parts,
                workers=args.workers,
                loadavg_before=[round(x, 2) for x in load_before],
                loadavg_after=[round(x, 2) for x in load_after],
            )


if __name__ == "__main__":
    main()

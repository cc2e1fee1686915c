"""Benchmark the serving lookup and its refresh, each figure against a baseline in the same run.

    python scripts/bench_serve.py [--json] [--quick]

A table of 1M keys (dim 16, Adagrad: 128-byte rows) in 2 rank stores, committed as ``v1``;
each later commit ``v2``, ``v3``, ... touches another 1% of the keys. A ``ServingLookup`` of
``v1`` with a 100k-row device cache and 64 MiB of host memory (embedding columns cached) takes
20 batches of 106,496 power-law keys (rank = N u^4, about 75k unique keys per batch):

1. opening the ``v1`` lookup (both rank stores' key indexes);
2. the 20 thrashing batches (the working set is larger than both caches), against the
   hot-set batches of figure 3: keys/s and store rows read;
3. 20 batches drawn from the 50k hottest keys (they fit the device cache), first pass and
   second pass (every row in the device cache), against ``index_select`` of the same rows
   from one flat tensor, the physical limit of a lookup that hits;
4. ``refresh`` to the next commit (replay of the added segments; every changed key cached),
   against opening that commit and re-warming with the thrashing batches (median of
   3 rounds, one per later commit, interleaved); then a rollback to ``v1`` (the diff path, which
   opens the older commit's key index) against the replay.

Every hot-set batch is checked against the rows v1 holds before the warm pass is timed, and
each refresh must be a replay of exactly the keys its commit touched.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter, interleaved

from daskhps.serve import ServingLookup, TableVersion
from daskhps.sharding import ShardMap
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec
from daskhps.table.init import mix64

WORKERS, SHARDS = 2, 16


@dataclass(frozen=True)
class Sizes:
    keys: int
    batches: int
    batch: int  # keys drawn per batch, before dedup (4096 examples x 26 fields)
    hot: int
    device_rows: int
    host_bytes: int
    touched: int  # keys each later commit updates
    refreshes: int


FULL = Sizes(1_000_000, 20, 4096 * 26, 50_000, 100_000, 64 << 20, 10_000, 3)
QUICK = Sizes(40_000, 5, 256 * 26, 2_000, 4_000, 1 << 20, 400, 2)


class Tables:
    """The rank stores of one table under ``root``, written as a trainer writes them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.spec = TableSpec("emb", 16, OptimizerSpec(kind="adagrad", lr=0.05))

    def train_and_commit(
        self, keys: torch.Tensor, commit: str, seed: int, peek: torch.Tensor
    ) -> torch.Tensor:
        """One Adagrad step on every key of ``keys``, committed as ``commit`` in each rank
        store; returns the embedding columns of the ``peek`` keys at that commit."""
        shard_map = ShardMap(SHARDS, WORKERS)
        owner, peek_owner = shard_map.worker(keys), shard_map.worker(peek)
        gen = torch.Generator().manual_seed(seed)
        rows = torch.empty(len(peek), self.spec.dim)
        for r in range(WORKERS):
            mine = keys[owner == r]
            path = self.root / self.spec.name / f"rank-{r}"
            with EmbeddingTable.open(self.spec, path, device_rows=len(mine)) as t:
                t.apply_gradients(mine, torch.randn(len(mine), self.spec.dim, generator=gen))
                t.commit(commit)
                rows[peek_owner == r] = t.peek(peek[peek_owner == r])[:, : self.spec.dim]
        return rows

    def version(self, commit: str) -> TableVersion:
        return TableVersion(self.root, self.spec, WORKERS, SHARDS, commit)


def skewed(keys: torch.Tensor, n: int, batches: int, batch: int, seed: int) -> list[torch.Tensor]:
    """Positions (into ``keys[:n]``) of ``batches`` deduplicated power-law batches."""
    gen = torch.Generator().manual_seed(seed)
    rank = (n * torch.rand(batches, batch, generator=gen) ** 4).long()
    return [r.unique() for r in rank]


def bench(rep: Reporter, root: Path, s: Sizes) -> None:
    tables = Tables(root)
    keys = mix64(torch.arange(s.keys, dtype=torch.int64))  # distinct, spread over int64
    t0 = time.perf_counter()
    hot_v1 = tables.train_and_commit(keys, "v1", seed=0, peek=keys[: s.hot])
    commits = []
    for i in range(s.refreshes):  # each later commit touches the next slice of keys
        commits.append(f"v{i + 2}")
        touched = keys[i * s.touched : (i + 1) * s.touched]
        tables.train_and_commit(touched, commits[-1], i + 1, peek=touched[:0])
    rep.emit("build the rank stores (not a figure)", time.perf_counter() - t0, "s")

    def open_lookup(commit: str) -> ServingLookup:
        version = tables.version(commit)
        return ServingLookup(version, device_rows=s.device_rows, host_bytes=s.host_bytes)

    cold = [keys[p] for p in skewed(keys, s.keys, s.batches, s.batch, seed=1)]
    hot_pos = skewed(keys, s.hot, s.batches, s.batch, seed=2)
    hot = [keys[p] for p in hot_pos]

    t = time.perf_counter()
    lookup = open_lookup("v1")
    t_open = time.perf_counter() - t
    rep.emit(f"open the v1 lookup ({s.keys:,} keys, {WORKERS} rank stores)", t_open * 1e3, "ms")
    try:
        t = time.perf_counter()
        for b in cold:
            lookup.lookup(b, unique=True)
        t_cold = time.perf_counter() - t
        n_cold = sum(len(b) for b in cold)
        cold_read = lookup.stats()["store_rows_read"]
        rows_from = lookup.stats()["rows_from"]

        n_hot = sum(len(b) for b in hot)
        hot_rates = []
        for _ in range(2):  # first pass fills the device cache, second pass hits only
            t = time.perf_counter()
            for b in hot:
                lookup.lookup(b, unique=True)
            hot_rates.append(n_hot / (time.perf_counter() - t))
        flat = hot_v1.contiguous()  # the hot rows as v1 holds them, in rank order
        for b, p in zip(hot, hot_pos, strict=True):
            if not torch.equal(lookup.lookup(b, unique=True), flat[p]):
                raise AssertionError("a hot-set lookup differs from the row v1 holds")
        before = dict(lookup.stats()["rows_from"])
        times = interleaved(
            {
                "lookup": lambda: [lookup.lookup(b, unique=True) for b in hot],
                "index_select": lambda: [torch.index_select(flat, 0, p) for p in hot_pos],
            },
            repeat=7,
        )
        after = lookup.stats()["rows_from"]
        if after["device"] - before["device"] != 8 * n_hot:  # warm-up + 7 runs, all hits
            raise AssertionError("the hot set did not stay in the device cache")
        warm_rate = n_hot / times["lookup"]
        rep.emit(
            f"{s.batches} thrashing batches ({n_cold:,} unique-per-batch keys)",
            n_cold / t_cold,
            "keys/s",
            baseline=warm_rate,
            baseline_name="hot-set batches, every row in the device cache",
            store_rows_read=cold_read,
            rows_from=rows_from,
        )
        rep.emit(
            f"{s.batches} hot-set batches ({s.hot:,} hottest keys), first pass",
            hot_rates[0],
            "keys/s",
            baseline=warm_rate,
            baseline_name="the same batches, every row in the device cache",
        )
        rep.emit(
            f"{s.batches} hot-set batches, every row in the device cache",
            warm_rate,
            "keys/s",
            baseline=n_hot / times["index_select"],
            baseline_name="index_select of the same rows from one flat tensor",
        )

        refresh_s, rewarm_s = [], []
        for commit in commits:  # interleaved: refresh, then what it saves
            report = lookup.refresh(tables.version(commit))
            if report.how != "replay" or report.changed_keys != s.touched:
                raise AssertionError(f"refresh to {commit}: {report}")
            refresh_s.append(report.seconds)
            t = time.perf_counter()
            with open_lookup(commit) as again:
                for b in cold:
                    again.lookup(b, unique=True)
                rewarm_read = again.stats()["store_rows_read"]
            rewarm_s.append(time.perf_counter() - t)
        replay = statistics.median(refresh_s)
        rep.emit(
            f"refresh, replay ({s.touched:,} changed keys)",
            replay * 1e3,
            "ms",
            baseline=statistics.median(rewarm_s) * 1e3,
            baseline_name="open the newer commit and re-warm with the thrashing batches",
            replaced_rows=report.replaced_rows,
            rows_read=report.rows_read,
            rewarm_rows_read=rewarm_read,
        )
        back = lookup.refresh(tables.version("v1"))
        if back.how != "diff":
            raise AssertionError(f"rollback to v1: {back}")
        rep.emit(
            f"refresh, rollback to v1 (diff, {back.changed_keys:,} changed keys)",
            back.seconds * 1e3,
            "ms",
            baseline=replay * 1e3,
            baseline_name="refresh, replay",
            open_lookup_ms=round(t_open * 1e3, 1),
            rows_read=back.rows_read,
        )
    finally:
        lookup.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not figures)")
    args = p.parse_args(argv)
    rep = Reporter(args.json)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as d:
        bench(rep, Path(d), QUICK if args.quick else FULL)
    rep.emit("threads", torch.get_num_threads(), "torch threads", cpus=os.cpu_count())
    load = os.getloadavg()
    rep.emit("load average, 1 min, at the end", load[0], "processes", cpus=os.cpu_count())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark the embedding table and its tiers, each figure against a baseline in the same run.

    python scripts/bench_table.py [--json] [--quick]

Figures (``--json``: one JSON object per line with name, value, unit, baseline, ratio):

1. device-tier lookups of hits (dim 64, batches of 262,144 keys over a 4M-row tier) against
   ``index_select`` of the same rows into a preallocated output, the physical limit;
2. insert/evict throughput of the device and host tiers (every insert into a full tier
   displaces a row) against ``index_copy_`` of the same rows, the memory-movement limit;
3. staging 100,000 rows scattered over a 2M-row zarr store (warm page cache) against a numpy
   memmap read of the same rows, and the same staging through the whole table;
4. a Zipf(1.1) key stream (lookup + Adagrad update per batch) through the full table with the
   device and host tiers each holding 1%, 10% or 100% of the distinct keys: hit rate per tier
   and keys/s, against the all-in-device run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter, interleaved, synchronizer

from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec
from daskhps.table.init import mix64
from daskhps.table.stats import STATS_WIDTH
from daskhps.tiers.device import DeviceCache
from daskhps.tiers.host import HostMemory, rows_for_bytes
from daskhps.tiers.store import open_store


def unique_random_keys(n: int, seed: int) -> torch.Tensor:
    """``n`` distinct pseudo-random int64 keys (a bijective mix of 0..n-1)."""
    return mix64(torch.arange(n, dtype=torch.int64) + seed * (1 << 40))


def fill(tier: DeviceCache | HostMemory, keys: torch.Tensor, width: int, batch: int) -> None:
    for i in range(0, len(keys), batch):
        k = keys[i : i + batch]
        tier.upsert(k, torch.full((len(k), width), float(i), device=k.device))


def bench_device_lookup(
    rep: Reporter, rows: int, batch: int, width: int, device: str = "cpu"
) -> None:
    cache = DeviceCache("bench/device", width, rows, device=device)
    keys = unique_random_keys(rows, seed=1).to(device)
    fill(cache, keys, width, 1 << 18)
    gen = torch.Generator().manual_seed(0)
    pos = torch.randint(0, rows, (batch,), generator=gen)
    probe = keys[pos.to(device)]
    slots = cache.find_slots(probe)
    out = torch.empty(batch, width, device=device)
    slab = cache.rows
    t = interleaved(
        {
            "lookup": lambda: cache.lookup(probe, out=out),
            "index_select": lambda: torch.index_select(slab, 0, slots, out=out),
        },
        repeat=9,
        sync=synchronizer(device),
    )
    on = "" if device == "cpu" else f" on {device}"
    rep.emit(
        f"device lookup hits{on}, dim {width}, {batch:,} keys over {rows:,} rows",
        batch / t["lookup"],
        "keys/s",
        baseline=batch / t["index_select"],
        baseline_name=f"index_select into a preallocated output{on}",
        goal_ratio=0.5,
    )
    stats = cache.stats.extra
    rep.emit("device index overhead per row", stats["index_bytes"] / rows, "bytes/row")


def bench_insert_evict(
    rep: Reporter, rows: int, batch: int, width: int, device: str = "cpu"
) -> None:
    """Both tiers on the CPU; with another ``device``, its device tier alone."""
    host_bytes = 1
    while rows_for_bytes(width, host_bytes) < rows:
        host_bytes *= 2
    lo, hi = host_bytes // 2, host_bytes
    while lo < hi:  # smallest budget that holds `rows` rows
        mid = (lo + hi) // 2
        if rows_for_bytes(width, mid) >= rows:
            hi = mid
        else:
            lo = mid + 1
    tiers: dict[str, DeviceCache | HostMemory] = {
        "device": DeviceCache("bench/device", width, rows, device=device)
    }
    if device == "cpu":
        tiers["host"] = HostMemory("bench/host", width, lo, pin_memory=False)
    on = "" if device == "cpu" else f" on {device}"
    gen = torch.Generator().manual_seed(1)
    for name, tier in tiers.items():
        keys = unique_random_keys(rows + 40 * batch, seed=2).to(device)
        fill(tier, keys[:rows], width, 1 << 18)
        assert len(tier) == tier.capacity_rows
        new = keys[rows:].split(batch)
        block = torch.randn(batch, width, generator=gen).to(device)
        slab = torch.empty(rows, width, device=device)
        dest = torch.randint(0, rows, (batch,), generator=gen).to(device)
        it = iter(new)
        t = interleaved(
            {
                "upsert": lambda tier=tier, it=it, b=block: tier.upsert(next(it), b),
                "index_copy": lambda s=slab, d=dest, b=block: s.index_copy_(0, d, b),
            },
            repeat=15,
            sync=synchronizer(device),
        )
        rep.emit(
            f"{name} insert+evict into a full tier{on}, dim {width}, {batch:,}-row batches",
            batch / t["upsert"],
            "rows/s",
            baseline=batch / t["index_copy"],
            baseline_name=f"index_copy_ of the same rows{on}",
        )


def bench_zarr_staging(rep: Reporter, tmp: Path, rows: int, take: int, width: int) -> None:
    keys = unique_random_keys(rows, seed=3)
    data = np.random.default_rng(0).standard_normal((rows, width), dtype=np.float32)
    t0 = time.perf_counter()
    store = open_store(
        tmp / "store", name="bench/zarr", width=width, layout={"width": width}, mode="w"
    )
    segments = 4
    for part in np.array_split(np.arange(rows), segments):
        store.upsert(keys[part], torch.from_numpy(data[part]))
    store.commit("built")
    rep.emit(
        f"zarr store write, {rows:,} rows x {width} in {segments} segments",
        rows / (time.perf_counter() - t0),
        "rows/s",
    )
    np.save(tmp / "flat.npy", data)
    mm = np.load(tmp / "flat.npy", mmap_mode="r")
    pos = np.sort(np.random.default_rng(1).choice(rows, take, replace=False))
    scattered = np.random.default_rng(2).permutation(pos)
    probe = keys[torch.from_numpy(scattered)]
    out_t = torch.empty(take, width)
    out_n = out_t.numpy()
    got = store.lookup(probe, out=out_t)
    assert bool(got.found.all()) and np.array_equal(out_n, data[scattered])
    t = interleaved(
        {
            "zarr": lambda: store.lookup(probe, out=out_t),
            "memmap": lambda: np.take(mm, scattered, axis=0, out=out_n),
        },
        repeat=9,
    )
    rep.emit(
        f"zarr tier read, {take:,} scattered rows of {rows:,} (warm cache)",
        take / t["zarr"],
        "rows/s",
        baseline=take / t["memmap"],
        baseline_name="numpy memmap read of the same rows",
        goal=1_000_000,
    )
    store.close()

    # Rows of ``width`` floats: the embedding and the row's statistics.
    spec = TableSpec("bench", dim=width - STATS_WIDTH, optimizer=OptimizerSpec(kind="sgd"))
    layout_store = tmp / "table"
    with EmbeddingTable.open(spec, layout_store, device_rows=take, mode="w") as table:
        for part in np.array_split(np.arange(rows), segments):
            table.store.upsert(keys[part], torch.from_numpy(data[part]))
        table.commit("built")

    with EmbeddingTable.open(spec, layout_store, device_rows=take, mode="r+") as table:
        stage_times, memmap_times = [], []
        for _ in range(6):
            table.device_cache.evict(n=take)  # clean rows: nothing is written
            t0 = time.perf_counter()
            report = table.stage(probe)
            stage_times.append(time.perf_counter() - t0)
            table.unpin()
            assert report.from_store == take
            t0 = time.perf_counter()
            np.take(mm, scattered, axis=0, out=out_n)
            memmap_times.append(time.perf_counter() - t0)
    rep.emit(
        f"table.stage of {take:,} rows from the zarr tier into the device tier",
        take / float(np.median(stage_times[1:])),
        "rows/s",
        baseline=take / float(np.median(memmap_times[1:])),
        baseline_name="numpy memmap read of the same rows",
    )


def zipf_stream(n_distinct: int, batches: int, batch: int, seed: int) -> list[torch.Tensor]:
    ranks = np.arange(1, n_distinct + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-1.1)
    cdf /= cdf[-1]
    rng = np.random.default_rng(seed)
    keys = unique_random_keys(n_distinct, seed=4)
    out = []
    for _ in range(batches):
        r = np.minimum(np.searchsorted(cdf, rng.random(batch)), n_distinct - 1)
        out.append(keys[torch.from_numpy(r)])
    return out


def bench_zipf(rep: Reporter, tmp: Path, n_distinct: int, batches: int, batch: int) -> None:
    spec = TableSpec("zipf", dim=32, optimizer=OptimizerSpec(kind="adagrad", lr=0.01))
    warm = zipf_stream(n_distinct, batches // 4, batch, seed=5)
    stream = zipf_stream(n_distinct, batches, batch, seed=6)
    grads = torch.full((batch, spec.dim), 1e-3)
    results = {}
    for frac in (1.0, 0.1, 0.01):
        rows = max(int(n_distinct * frac), 1)
        host_bytes = 0
        while rows_for_bytes(spec.width, host_bytes) < rows:
            host_bytes += max(rows * spec.row_bytes // 8, 1 << 16)
        path = tmp / f"zipf-{frac}"
        with EmbeddingTable.open(
            spec, path, device_rows=rows, host_bytes=host_bytes, mode="w"
        ) as table:
            for keys in warm:
                table.lookup(keys)
                table.apply_gradients(keys, grads)
            before = dict(table.stats()["rows_from"])
            t0 = time.perf_counter()
            for keys in stream:
                table.lookup(keys)
                table.apply_gradients(keys, grads)
            dt = time.perf_counter() - t0
            table.commit("bench")  # outside the timing: keeps the rows, as a real run would
            after = table.stats()["rows_from"]
            got = {k: after[k] - before[k] for k in after}
            total = sum(got.values())
            results[frac] = len(stream) * batch / dt
            label = f"zipf(1.1) stream, device+host each {frac:.0%} of {n_distinct:,} keys"
            rep.emit(
                label,
                results[frac],
                "keys/s",
                baseline=results[1.0],
                baseline_name="same stream, device tier holds every key",
                device_hit=round(got["device"] / total, 4),
                host_hit=round(got["host"] / total, 4),
                zarr_hit=round(got["store"] / total, 4),
                init=round(got["init"] / total, 4),
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not figures)")
    p.add_argument("--only", choices=["lookup", "insert", "zarr", "zipf"], action="append")
    args = p.parse_args(argv)
    rep = Reporter(args.json)
    torch.manual_seed(0)
    q = args.quick
    only = set(args.only or ["lookup", "insert", "zarr", "zipf"])
    with tempfile.TemporaryDirectory(prefix="bench-table-") as d:
        tmp = Path(d)
        if "lookup" in only:
            bench_device_lookup(rep, 1 << 16 if q else 4 << 20, 1 << 12 if q else 1 << 18, 64)
        if "insert" in only:
            bench_insert_evict(rep, 1 << 14 if q else 1 << 20, 1 << 10 if q else 1 << 16, 64)
        if "zarr" in only:
            bench_zarr_staging(rep, tmp, 50_000 if q else 2_000_000, 5_000 if q else 100_000, 64)
        if "zipf" in only:
            bench_zipf(rep, tmp, 50_000 if q else 1_000_000, 20 if q else 200, 256 if q else 4096)
    rep.emit("threads", torch.get_num_threads(), "torch threads", cpus=os.cpu_count())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

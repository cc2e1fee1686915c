"""Measure the means of a device-tier hit lookup against the gather limit, in one run.

    python scripts/bench_index_probe.py [--json] [--quick] [--repeat N]

The device tier answers a lookup with three dependent random reads per key: the key's bucket in
the hash index, the row in the slab, the row's LRU stamp (written). The gather limit,
``index_select`` of the same rows into a preallocated output, makes one. This script times, over
the same 4M-row tier and the same 262,144 hit keys, each against that gather in the same run:

1. ``DeviceCache.lookup`` as shipped (torch kernels: hash, bucket gather, compare, value
   extraction, spill round, row gather, stamp update);
2. the shipped index probe alone (``KeyIndex.get``), and the lookup's steps timed one by one
   inside real lookups, where each step evicts the others' lines from the caches;
3. pandas' khash ``Int64HashTable.lookup`` (keys -> slots), the probe alone, for comparison;
4. with numba installed (it is not a dependency): one fused kernel per lookup, hash + probe +
   row copy + stamp in a single pass over the keys, in groups of 32 keys with software prefetch
   of each group's buckets, then its rows and stamps. This is the best arrangement of the three
   reads we know short of a different memory system; it is measured here because it bounds what
   any implementation of this layout can reach on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter, interleaved
from bench_table import fill, unique_random_keys

from daskhps._mix64 import M1, M2, SHIFTS
from daskhps.tiers.device import DeviceCache
from daskhps.tiers.index import _PAIRS, _SEED

WIDTH = 64
GROUP = 32  # keys whose reads are prefetched together in the fused kernel


def fused_lookup_kernel() -> Callable[..., Any] | None:
    """The fused numba lookup over the shipped index layout, or None without numba."""
    try:
        from llvmlite import ir
        from numba import njit, prange, types
        from numba.core import cgutils
        from numba.extending import intrinsic
    except ImportError:
        return None

    @intrinsic
    def prefetch(typingctx, arr, idx):  # type: ignore[no-untyped-def]
        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]])
            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            consts = [ir.Constant(i32, v) for v in (0, 3, 1)]  # read, keep, data cache
            builder.call(fn, [builder.bitcast(ptr, i8p), *consts])
            return context.get_dummy_value()

        return types.void(arr, idx), codegen

    # The index's own hash (tiers.index._home): its seed, then fmix64 without the last step.
    seed, m1, m2 = np.uint64(_SEED), np.uint64(M1), np.uint64(M2)
    s1, s2, s32 = np.uint64(SHIFTS[0]), np.uint64(SHIFTS[1]), np.uint64(32)
    row = 2 * _PAIRS  # int64s per bucket: the compares below are unrolled for four pairs
    assert _PAIRS == 4, "the fused kernel's compares assume four pairs per bucket"

    @njit(nogil=True, parallel=True, boundscheck=False)
    def lookup(table, spill, buckets, keys, slab, width, out, stamp, clock, missing):  # type: ignore[no-untyped-def]
        n = keys.shape[0]
        for g in prange((n + GROUP - 1) // GROUP):
            lo, hi = g * GROUP, min(n, g * GROUP + GROUP)
            home = np.empty(GROUP, np.int64)
            slot = np.empty(GROUP, np.int64)
            for i in range(lo, hi):  # each key's home bucket
                z = np.uint64(keys[i]) ^ seed
                z ^= z >> s1
                z *= m1
                z ^= z >> s2
                z *= m2
                home[i - lo] = np.int64(((z >> s32) * np.uint64(buckets)) >> s32)
                prefetch(table, home[i - lo] * row)
            for i in range(lo, hi):
                k, b, s = keys[i], home[i - lo], missing
                while True:
                    o = b * row
                    if table[o] == k:
                        s = table[o + 1]
                        break
                    if table[o + 2] == k:
                        s = table[o + 3]
                        break
                    if table[o + 4] == k:
                        s = table[o + 5]
                        break
                    if table[o + 6] == k:
                        s = table[o + 7]
                        break
                    if spill[b] == 0:
                        break
                    b += 1
                slot[i - lo] = s
                for j in range(0, width, 16):
                    prefetch(slab, s * width + j)
                prefetch(stamp, s)
            for i in range(lo, hi):
                s = slot[i - lo]
                for j in range(width):
                    out[i, j] = slab[s * width + j]
                stamp[s] = clock

    return lookup


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not figures)")
    p.add_argument("--repeat", type=int, default=9)
    args = p.parse_args(argv)
    rep = Reporter(args.json)
    rows, batch = (1 << 16, 1 << 12) if args.quick else (1 << 22, 1 << 18)
    cache = DeviceCache("bench/device", WIDTH, rows)
    keys = unique_random_keys(rows, seed=1)
    fill(cache, keys, WIDTH, 1 << 18)
    pos = torch.randint(0, rows, (batch,), generator=torch.Generator().manual_seed(0))
    probe = keys[pos]
    slots = cache.find_slots(probe)
    out = torch.empty(batch, WIDTH)
    index = cache._index  # the probe alone: what the lookup spends before its gather
    fns: dict[str, Callable[[], object]] = {
        "gather": lambda: torch.index_select(cache.rows, 0, slots, out=out),
        "lookup": lambda: cache.lookup(probe, out=out),
        "probe": lambda: index.get(probe),
    }
    from pandas._libs import hashtable

    khash = hashtable.Int64HashTable(rows)
    khash.map_locations(keys.numpy())
    fns["khash"] = lambda: khash.lookup(probe.numpy())
    fused = fused_lookup_kernel()
    if fused is not None:
        fused_out = torch.empty(batch, WIDTH)
        flat_table = index._table.view(-1).numpy()
        args_ = (flat_table, index._spill.numpy(), index._buckets, probe.numpy(),
                 cache.rows.view(-1).numpy(), WIDTH, fused_out.numpy(),
                 cache._policy.stamp.numpy(), 1, rows)  # fmt: skip
        t0 = time.perf_counter()
        fused(*args_)
        rep.emit("numba fused lookup: compile", time.perf_counter() - t0, "s")
        cache.lookup(probe, out=out)
        if not torch.equal(out, fused_out):
            raise AssertionError("the fused kernel's rows differ from DeviceCache.lookup's")
        fns["fused"] = lambda: fused(*args_)
    t = interleaved(fns, repeat=args.repeat)
    base = batch / t["gather"]
    names = {
        "lookup": "DeviceCache.lookup as shipped",
        "probe": "shipped index probe alone (KeyIndex.get)",
        "khash": "pandas khash Int64HashTable.lookup, probe alone",
        "fused": "numba fused lookup (prefetched groups), rows included",
    }
    for k, label in names.items():
        if k in t:
            rep.emit(
                f"{label}, {batch:,} keys over {rows:,} rows",
                batch / t[k],
                "keys/s",
                baseline=base,
                baseline_name="index_select into a preallocated output",
            )

    # The lookup's own steps, each timed inside a real lookup sequence (warm caches lie).
    steps: dict[str, list[float]] = {"probe": [], "gather": [], "stamp": []}
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        s, _ = index.get(probe, default=rows)
        t1 = time.perf_counter()
        torch.index_select(cache.rows, 0, s, out=out)
        t2 = time.perf_counter()
        cache._policy.touch(s)
        t3 = time.perf_counter()
        steps["probe"].append(t1 - t0)
        steps["gather"].append(t2 - t1)
        steps["stamp"].append(t3 - t2)
    for k, v in steps.items():
        alone = t.get(k)  # the same step timed on its own above (the stamp never is)
        extra = {"alone_ms": round(alone * 1e3, 3)} if alone is not None else {}
        rep.emit(f"inside a lookup: {k}", statistics.median(v) * 1e3, "ms", **extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())

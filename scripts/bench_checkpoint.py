"""Benchmark what a delta checkpoint costs against the table it belongs to, same run.

    python scripts/bench_checkpoint.py [--json] [--quick] [--rows N]

A checkpoint's table part is one commit of every shard's zarr store (docs/checkpoints.md);
its dense part does not depend on the table. One real shard of ``--rows`` rows (dim 16,
Adagrad: 128-byte rows) is written and committed once (the base), then for 100, 1,000 and
10,000 touched rows (staged, updated, unpinned, as a pass does) one more commit each, a delta.
Figures, each against the base commit of the same store:

1. bytes the delta adds on disk (the issue's "delta size follows touched rows, not table
   size"), with the bytes of the touched rows themselves beside it;
2. seconds the delta's commit takes;
3. what ``checkpoint.replicate_to`` adds: the store's new files mirrored to a copy (a folder
   on the same disk, as a ``file://`` URL), bytes and seconds against the commit's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter

from daskhps.runfiles.replica import Replica, mirror_store
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec

STRIDE = 7919  # spreads the keys over the int64 range's low end, as hashed keys would not


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _touch(table: EmbeddingTable, keys: torch.Tensor) -> None:
    table.stage(keys)
    table.apply_gradients(keys, torch.full((len(keys), table.spec.dim), 0.01))
    table.unpin()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--quick", action="store_true", help="a small table: a smoke run")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the table")
    args = ap.parse_args(argv)
    rows = 20_000 if args.quick else args.rows
    touched = [n for n in (100, 1_000, 10_000) if n < rows // 2]
    rep = Reporter(args.json)
    spec = TableSpec("bench", 16, OptimizerSpec(kind="adagrad", lr=0.1))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank-0"
        with EmbeddingTable.open(spec, path, device_rows=rows + 1000) as table:
            _touch(table, torch.arange(rows, dtype=torch.int64) * STRIDE)
            t0 = time.perf_counter()
            table.commit("pass-000001")  # the base: every row written once
            base_s = time.perf_counter() - t0
            base = _bytes(path)
            rep.emit(f"base commit, {rows:,} rows", base / 2**20, "MiB", seconds=round(base_s, 3))
            copy = Replica(f"file://{Path(tmp) / 'copy'}")
            dest = copy.store_path("stores", "bench", 0)

            def mirror(what: str, commit_s: float) -> None:
                t0 = time.perf_counter()
                moved = mirror_store(copy.fs, path, dest)
                rep.emit(  # milliseconds: a small delta's copy rounds to 0 s
                    f"{what}: copied to checkpoint.replicate_to, milliseconds",
                    (time.perf_counter() - t0) * 1e3,
                    "ms",
                    baseline=commit_s * 1e3,
                    baseline_name="its commit's seconds",
                    copied_kib=round(moved.bytes / 2**10, 1),
                    files=moved.files,
                )

            mirror(f"base commit, {rows:,} rows", base_s)
            gen = torch.Generator().manual_seed(0)
            for i, n in enumerate(touched):
                keys = torch.randperm(rows, generator=gen)[:n] * STRIDE
                _touch(table, keys)
                before = _bytes(path)
                t0 = time.perf_counter()
                table.commit(f"pass-{i + 2:06d}")
                seconds = time.perf_counter() - t0
                added = _bytes(path) - before
                rep.emit(
                    f"delta commit, {n:,} touched rows of {rows:,}: bytes added",
                    added / 2**10,
                    "KiB",
                    baseline=base / 2**10,
                    baseline_name="the base commit's bytes (the whole table)",
                    touched_row_kib=round(n * spec.row_bytes / 2**10, 1),
                )
                rep.emit(
                    f"delta commit, {n:,} touched rows of {rows:,}: seconds",
                    seconds,
                    "s",
                    baseline=base_s,
                    baseline_name="the base commit's seconds",
                )
                mirror(f"delta commit, {n:,} touched rows of {rows:,}", seconds)


if __name__ == "__main__":
    main()

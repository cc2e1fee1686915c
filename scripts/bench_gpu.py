"""Benchmark the CUDA paths, each figure against a baseline in the same run.

    python scripts/bench_gpu.py [--json] [--quick] [--device cuda] [--out FILE]

Figures (``--json``: one JSON object per line, the convention of every benchmark here):

1. device-tier lookups of hits on ``--device`` (dim 64, 262,144 keys over a 4M-row tier, or
   smaller with ``--quick``) against ``index_select`` of the same rows into a preallocated
   output on the same device, the gather limit (``bench_table.py``'s figure, on the GPU);
2. insert+evict into a full device tier against ``index_copy_`` of the same rows;
3. one training pass of the DLRM of ``scripts/bench_train.py`` with the table's device tier,
   the dense model and the batches on ``--device``, against the same pass on the CPU, in
   examples/s (the pass's staging included on both sides).

GPU work is asynchronous: every timed call ends with a device synchronisation. ``--device cpu``
runs the same code on the CPU (a smoke run: the ratios are then near 1 by construction).
``--out`` also writes the records, one JSON object per line, to ``FILE``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter, synchronizer
from bench_table import bench_device_lookup, bench_insert_evict
from bench_train import DaskhpsSide, make_data


def bench_pass(rep: Reporter, device: torch.device, tmp: Path, quick: bool) -> None:
    if quick:
        cfg = {"vocab": 20_000, "batch": 512, "batches_per_pass": 3, "passes": 2}
    else:
        cfg = {"vocab": 1_000_000, "batch": 4096, "batches_per_pass": 10, "passes": 3}
    data = make_data(**cfg, zipf=1.05, seed=1)
    n = len(data.distinct)
    ours = device.type if device.type != "cpu" else "cpu again"
    rates: dict[str, float] = {}
    for name, dev in (("cpu", "cpu"), (ours, str(device))):
        side = DaskhpsSide.open(
            tmp / name.replace(" ", "-"), device_rows=n, host_bytes=0,
            flush_each_pass=False, device=dev,
        )  # fmt: skip
        passes = [p.to(dev) for p in data.passes]
        side.train_pass(passes[0])  # warm-up: first kernels, the allocator
        wait = synchronizer(dev) or (lambda: None)
        t0 = time.perf_counter()
        for p in passes[1:]:
            side.train_pass(p)
        wait()
        rates[name] = sum(p.num_examples for p in passes[1:]) / (time.perf_counter() - t0)
        side.table.close(uncommitted="drop")
    rep.emit(
        f"{ours} training pass, dlrm dim 16, {cfg['batch']:,}-example batches",
        rates[ours],
        "examples/s",
        baseline=rates["cpu"],
        baseline_name="the same passes on the CPU",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not figures)")
    p.add_argument("--device", default="cuda", help="where the tier and the model run")
    p.add_argument("--out", type=Path, help="also write the records (JSON lines) here")
    args = p.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        print(f"bench_gpu: --device {args.device!r} is not a torch device; use cuda, cuda:N or cpu")
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: torch sees no CUDA device; pass --device cpu for a smoke run")
        return 2
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    rep = Reporter(args.json)
    rows, batch, ins = (1 << 16, 1 << 12, 1 << 10) if args.quick else (1 << 22, 1 << 18, 1 << 16)
    failed = []
    with tempfile.TemporaryDirectory(prefix="bench_gpu-") as d:
        for name, run in (
            ("lookup", lambda: bench_device_lookup(rep, rows, batch, 64, str(device))),
            ("insert", lambda: bench_insert_evict(rep, rows, ins, 64, str(device))),
            ("pass", lambda: bench_pass(rep, device, Path(d), args.quick)),
        ):
            try:
                run()
            except Exception as e:  # one figure's failure must not hide the others'
                failed.append(name)
                print(f"bench_gpu: {name} failed: {type(e).__name__}: {e}", flush=True)
    if args.out is not None:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rep.results))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

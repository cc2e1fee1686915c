"""Benchmark the network cost of a pass: the bytes each host sends and receives, measured on
two workers, and the network time of a pass projected for more hosts and faster links.

    python scripts/bench_network.py [--json] [--rows N] [--pass-rows N] [--batch N]
                                    [--dim D] [--latency-us U] [--out DIR] [--keep]

Generates a day of Criteo-format logs (``--rows``, 300k by default), trains it on the embedded
LocalCluster ``daskhps train`` starts (2 worker processes, 2 threads each) in passes of
``--pass-rows``, and reads each pass's ``network`` record from ``metrics.jsonl``
(daskhps.monitor.network): the bytes between the ranks by kind, the least the pass needs, and
the pass's training seconds (``seconds.train``, the driver's wall time of the pass).

The projection, for 4, 16 and 64 hosts at 10 and 100 Gb/s, rests on this model:

* every host trains as many examples a pass as here, in as many batches (weak scaling: the
  global batch and the pass grow with the hosts), so a pass's compute time stays this one's;
* keys are hashed uniformly over the owners, so a host finds ``1/n`` of its keys at home and
  sends (and serves) the other ``(n - 1)/n``; the same holds for the examples it did not read
  and the pass's keys it does not own; a ring all-reduce moves ``2 (n - 1)/n`` of the dense
  gradients. Every kind thus scales as ``(n - 1)/n`` of the traffic a host would move if
  nothing were local, which is twice what it moves with two hosts (half is local there):
  ``bytes(n) = 2 (n - 1)/n * bytes(2)``, for the busiest host, in its busier direction;
* a host's time is its bytes over the link's bandwidth (sending and receiving at once, full
  duplex), with full bisection bandwidth: every host talks to every other at link speed at
  once. A fabric oversubscribed k:1 divides that by up to k for the traffic crossing it;
* latency: each batch runs 4 all-to-alls (key counts, keys, rows, gradients) and one
  all-reduce; at ``--latency-us`` a message, a pass spends at least
  ``batches * (4 + 2 (n - 1)) * latency`` waiting (each all-to-all one round, a ring
  all-reduce ``2 (n - 1)`` steps). Reported beside the bandwidth figure;
* examples/s of ``n`` hosts: ``n`` times a host's examples a pass, over the pass's compute
  seconds plus its network seconds plus that latency (a batch waits for its rows: nothing of
  the exchange overlaps the compute).

The logs and the run are removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter

from daskhps.config import RunConfig
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.monitor.network import KINDS
from daskhps.sharding import ShardMap
from daskhps.training.trainer import Trainer

HOSTS = (4, 16, 64)
LINKS_GBPS = (10, 100)
MEASURED_HOSTS = 2


def config(tmp: Path, logs: Path, pass_rows: int, batch: int, dim: int) -> RunConfig:
    """The quickstart's model and table (DLRM, dim 16, Adagrad) on 2 workers."""
    return RunConfig.from_dict(
        {
            "run": {"name": "network", "dir": str(tmp / "run"), "seed": 0, "quiet": True},
            "data": {"train": {"paths": [str(logs)]}, "holdout": None},
            "passes": {
                "epochs": 1,
                "examples_per_pass": pass_rows,
                "global_batch_size": batch,
                "num_shards": 16,
            },
            "table": {
                "dim": dim,
                "optimizer": {"kind": "adagrad", "lr": 0.05},
                "tiers": {"device": {"fraction": 0.07}, "host": {"fraction": 0.07}},
            },
            "model": {"name": "dlrm", "options": {"bottom_mlp": [64, 16], "top_mlp": [64, 32]}},
            "dense_optimizer": {"kind": "adam", "lr": 1.0e-3},
            "cluster": {
                "n_workers": MEASURED_HOSTS,
                "threads_per_worker": 2,
                "memory_limit": "2GiB",
                "gpu": False,
                "dashboard_address": "127.0.0.1:0",
            },
        },
        source="bench_network",
    )


def busiest(figures: dict[str, Any]) -> int:
    """The busiest rank's bytes of one kind, in its busier direction."""
    pairs = zip(figures["rank_sent"], figures["rank_received"], strict=True)
    return max(max(s, r) for s, r in pairs)


def least(figures: dict[str, Any]) -> int:
    """The busiest rank's least bytes of one kind, in its busier direction."""
    return int(figures["max_min"])


def project(bytes_2: float, hosts: int) -> float:
    """A host's bytes on ``hosts`` hosts from its bytes on 2 (see the module docstring)."""
    return 2.0 * (hosts - 1) / hosts * bytes_2


def owner_count_seconds(logs: Path, examples: int, batch: int) -> float:
    """Seconds to count one rank's unique keys of a pass by owner from its batches' routed
    keys (what the record's least costs on the worker, once a pass): the log's first
    ``examples`` rows in batches of ``batch``, their keys split between two owners."""
    import torch

    from daskhps.data.readers import read_click_log
    from daskhps.distributed import Exchange
    from daskhps.monitor.network import PassKeys

    frame = read_click_log(str(logs)).frame.partitions[0].compute().head(examples)
    cats = [c for c in frame.columns if c.startswith("C")]
    keys = torch.from_numpy(frame[cats].to_numpy(dtype="int64").copy())
    ex = Exchange(None, ShardMap(16, 1))
    routed = [ex.route(keys[b : b + batch]) for b in range(0, len(keys), batch)]
    times = []
    for _ in range(5):
        seen = PassKeys()
        t = time.perf_counter()
        for r in routed:
            seen.add(r.keys, [len(r.keys) // 2, len(r.keys) - len(r.keys) // 2])
        seen.by_owner(MEASURED_HOSTS)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(tmp: Path, rep: Reporter, args: argparse.Namespace) -> None:
    logs = tmp / "logs"
    generate(
        GeneratorConfig(rows_per_day=args.rows, parts_per_day=4, seed=0, vocab_scale=0.1), logs
    )
    t0 = time.perf_counter()
    result = Trainer(config(tmp, logs, args.pass_rows, args.batch, args.dim), progress=False).run()
    wall = time.perf_counter() - t0
    passes = result.passes
    load = round(os.getloadavg()[0], 2)
    # the first pass warms the workers (imports, the first collectives): left out when there
    # are others
    steady = passes[1:] or passes
    pass_s = statistics.median(p["seconds"]["train"] for p in steady)
    batches = steady[0]["network"]["batches"]
    common = {"load": load, "passes": len(passes), "batches_per_pass": batches}
    rep.emit(
        "pass training seconds (2 workers, measured)",
        pass_s,
        "s",
        examples_per_pass=steady[0]["examples"],
        examples_per_s=round(statistics.median(p["examples_per_s"] for p in steady)),
        run_seconds=round(wall, 1),
        **common,
    )
    per_kind: dict[str, float] = {}
    for kind in (*KINDS, "total"):
        got = statistics.median(busiest(p["network"][kind]) for p in steady)
        need = statistics.median(least(p["network"][kind]) for p in steady)
        per_kind[kind] = got
        rep.emit(
            f"bytes a pass, busiest host: {kind}",
            got,
            "B",
            baseline=need or None,
            baseline_name="the least the pass needs",
            sum_over_hosts=int(statistics.median(p["network"][kind]["sent"] for p in steady)),
        )
    half = args.pass_rows // MEASURED_HOSTS
    rep.emit(
        f"counting a rank's pass keys by owner ({half} examples)",
        owner_count_seconds(logs, half, args.batch // MEASURED_HOSTS) * 1e3,
        "ms",  # milliseconds: a figure this small keeps its digits in the 4 decimals printed
        baseline=pass_s * 1e3,
        baseline_name="the pass's training seconds",
        load=load,
    )
    for hosts in HOSTS:
        for gbps in LINKS_GBPS:
            host_bytes = project(per_kind["total"], hosts)
            seconds = host_bytes * 8 / (gbps * 1e9)
            latency = batches * (4 + 2 * (hosts - 1)) * args.latency_us * 1e-6
            # The exchange is synchronous (a batch waits for its rows), so a pass takes its
            # compute, its bytes on the link and its messages' latency, one after the other.
            per_host = steady[0]["examples"] / MEASURED_HOSTS
            rep.emit(
                f"network seconds a pass, {hosts} hosts at {gbps} Gb/s",
                seconds,
                "s",
                host_bytes=int(host_bytes),
                of_pass=round(seconds / pass_s, 4),
                latency_s=round(latency, 4),
                examples_per_s=round(hosts * per_host / (pass_s + seconds + latency)),
                by_kind={k: int(project(per_kind[k], hosts)) for k in KINDS},
            )
    if args.out:
        (tmp / "passes.json").write_text(json.dumps([p["network"] for p in passes], indent=1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--rows", type=int, default=300_000, help="rows of the day (default 300k)")
    ap.add_argument("--pass-rows", type=int, default=100_000, help="examples a pass")
    ap.add_argument("--batch", type=int, default=4096, help="global batch size")
    ap.add_argument("--dim", type=int, default=16, help="embedding dim")
    ap.add_argument(
        "--latency-us", type=float, default=20.0, help="one message's latency (an assumption)"
    )
    ap.add_argument("--out", default=None, help="folder for the logs and run (default: temp)")
    ap.add_argument("--keep", action="store_true", help="keep the logs and run")
    args = ap.parse_args(argv)
    rep = Reporter(args.json)
    tmp = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-network-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        measure(tmp, rep, args)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

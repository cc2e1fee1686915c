"""Benchmark the training step of one rank, each figure against a baseline in the same run.

    python scripts/bench_train.py [--json] [--quick]

Both sides start from the same generated batches of int64 keys (26 categorical fields with
Zipf-like key popularity, 13 dense features, labels from a planted logistic model), the same
DLRM shape (``build_model("dlrm", ...)``, small MLPs, identical initial dense weights), Adagrad
for the embeddings and Adam for the dense model.

1. daskhps, 1 rank, table fits in memory, against plain PyTorch: per pass, the pass's keys are
   staged into the device tier of an ``EmbeddingTable``; per batch the same step as
   ``daskhps.training.worker.train_pass`` (``Exchange.route`` -> ``pull_rows(table.lookup)`` ->
   model -> BCE sum / B -> backward -> ``push_grads(table.apply_gradients)`` -> dense step).
   The baseline maps keys to rows of one flat ``nn.Embedding(sparse=True)`` by ``searchsorted``
   over the sorted distinct keys (mapping included in its time) and updates it with
   ``torch.optim.Adagrad``. Figures: examples/s, ratio daskhps / baseline, (a) with staging
   charged to the pass, run after it; (b) pipelined as the trainer runs it: pass k+1 staged on
   a second thread while pass k trains (every table call under one lock, as ``WorkerShards``
   does), then unpin and re-pin pass k+1; wall clock.
2. daskhps with the table 10x larger than its host tier (device tier just fits one pass's
   working set, so rows go to the zarr store and back between passes) against the same run
   with every row in the device tier: examples/s including staging, hit rate of each tier.
3. seconds per stage per pass (stage, pull, forward/backward, push, dense step, flush) of both
   daskhps runs.
4. 2 ranks (2 processes, a real gloo group, 1 torch thread each, each rank half of every
   global batch and the owner of half the keys) against 1 rank (1 process, 2 torch threads) on
   the same global batches: examples/s, runs alternated.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter, interleaved

from daskhps.distributed import Comm
from daskhps.distributed.exchange import Exchange
from daskhps.models import build_model
from daskhps.sharding import ShardMap
from daskhps.table import EmbeddingTable, OptimizerSpec, StageReport, TableSpec
from daskhps.table.init import init_embedding, mix64
from daskhps.tiers.host import rows_for_bytes
from daskhps.training.worker import train_step

NUM_FIELDS = 26
NUM_DENSE = 13
DIM = 16
MODEL_OPTS = {"bottom_mlp": (64,), "top_mlp": (64, 32)}
DENSE_LR = 1e-3
SPARSE_LR = 0.05
NUM_SHARDS = 64
SEED = 7


# -- data --------------------------------------------------------------------------------


@dataclass
class Pass:
    """One pass of examples, cut into global batches (one rank trains the whole batch)."""

    dense: torch.Tensor  # float32[n, NUM_DENSE]
    keys: torch.Tensor  # int64[n, NUM_FIELDS]
    labels: torch.Tensor  # float32[n]
    batch_size: int

    @property
    def num_examples(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_batches(self) -> int:
        return -(-self.num_examples // self.batch_size)

    def batch(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lo, hi = b * self.batch_size, (b + 1) * self.batch_size
        return self.dense[lo:hi], self.keys[lo:hi], self.labels[lo:hi]

    def to(self, device: str) -> Pass:
        """The same pass with its tensors on ``device``."""
        return Pass(
            self.dense.to(device), self.keys.to(device), self.labels.to(device), self.batch_size
        )


@dataclass
class Data:
    """Passes of global batches (one rank holds the whole batch) and the distinct keys."""

    passes: list[Pass]
    batch_size: int
    distinct: torch.Tensor  # sorted distinct keys of all passes


def field_sizes(total: int) -> np.ndarray:
    """Vocabulary per field, spread over three orders of magnitude like Criteo's fields."""
    w = np.geomspace(1.0, 1000.0, NUM_FIELDS)
    return np.maximum((w / w.sum() * total).astype(np.int64), 4)


def make_data(
    vocab: int, batch: int, batches_per_pass: int, passes: int, zipf: float, seed: int
) -> Data:
    rng = np.random.default_rng(seed)
    sizes = field_sizes(vocab)
    cdfs = []
    for v in sizes:
        c = np.cumsum(np.arange(1, v + 1, dtype=np.float64) ** -zipf)
        cdfs.append(c / c[-1])
    n = batch * batches_per_pass
    # planted logistic model: a weight per (field, value rank) and per dense feature
    wf = [rng.normal(0.0, 0.6, v) for v in sizes]
    wd = rng.normal(0.0, 0.3, NUM_DENSE)
    out = []
    for _ in range(passes):
        vals = np.empty((n, NUM_FIELDS), np.int64)
        logit = np.full(n, -1.5)
        for f, (cdf, v) in enumerate(zip(cdfs, sizes, strict=True)):
            r = np.minimum(np.searchsorted(cdf, rng.random(n)), v - 1)
            vals[:, f] = r
            logit += wf[f][r] / np.sqrt(NUM_FIELDS / 4)
        dense = rng.standard_normal((n, NUM_DENSE)).astype(np.float32)
        logit += dense @ wd
        labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        raw = torch.from_numpy(vals + (np.arange(NUM_FIELDS, dtype=np.int64) << 40))
        keys = mix64(raw)  # int64 feature hashes, as the click-log pipeline produces
        out.append(Pass(torch.from_numpy(dense), keys, torch.from_numpy(labels), batch))
    distinct = torch.unique(torch.cat([p.keys.reshape(-1) for p in out]))
    return Data(out, batch, distinct)


def new_model() -> nn.Module:
    torch.manual_seed(SEED)  # the same initial dense weights on both sides
    return build_model(
        "dlrm", num_dense=NUM_DENSE, num_fields=NUM_FIELDS, embedding_dim=DIM, **MODEL_OPTS
    )


# -- daskhps: one rank's training step --------------------------------------------------

STAGES = ("stage", "pull", "forward_backward", "push", "dense_step", "unpin", "flush")


@dataclass
class DaskhpsSide:
    """One rank of the trainer, in-process: its table shard, dense replica and exchange."""

    table: EmbeddingTable
    model: nn.Module
    opt: torch.optim.Optimizer
    exchange: Exchange
    flush_each_pass: bool
    times: list[dict[str, float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    staged: list[dict[str, int]] = field(default_factory=list)
    sources: list[dict[str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)  # WorkerShards' table lock

    @classmethod
    def open(
        cls,
        path: Path,
        device_rows: int,
        host_bytes: int,
        flush_each_pass: bool,
        comm: Comm | None = None,
        device: str = "cpu",
    ) -> DaskhpsSide:
        spec = TableSpec("bench", dim=DIM, optimizer=OptimizerSpec(kind="adagrad", lr=SPARSE_LR))
        table = EmbeddingTable.open(
            spec, path, device_rows=device_rows, host_bytes=host_bytes, mode="w", device=device
        )
        model = new_model().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=DENSE_LR)
        ex = Exchange(comm, ShardMap(NUM_SHARDS, comm.world_size if comm else 1))
        return cls(table, model, opt, ex, flush_each_pass)

    @property
    def rank(self) -> int:
        return self.exchange.comm.rank if self.exchange.comm is not None else 0

    def stage(self, data: Pass) -> StageReport:
        keys = data.keys.reshape(-1)
        if self.exchange.world_size > 1:  # the keys this rank owns
            keys = keys[self.exchange.shard_map.worker(keys) == self.rank]
        with self.lock:
            return self.table.stage(keys)

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        with self.lock:
            return self.table.lookup(keys)

    def apply_gradients(self, keys: torch.Tensor, grads: torch.Tensor) -> None:
        with self.lock:
            self.table.apply_gradients(keys, grads)

    def train_pass(self, data: Pass, ahead: Pass | None = None) -> None:
        """Stage the pass's keys, train its batches (the step of ``worker.train_pass``),
        release the pins and optionally write dirty rows back.

        With ``ahead`` the pass is already staged (pinned) and is trained as the trainer
        pipelines it: ``ahead`` is staged on a second thread meanwhile, then the pins are
        released and ``ahead`` is re-pinned (its "stage" time: the wait and the re-pin).
        """
        table, model, ex, opt = self.table, self.model, self.exchange, self.opt
        t: dict[str, float] = defaultdict(float)
        before = dict(table.stats()["rows_from"])
        worker = None
        if ahead is None:
            t0 = time.perf_counter()
            rep = self.stage(data)
            t["stage"] = time.perf_counter() - t0
            self.staged.append(
                {"from_device": rep.from_device, "from_host": rep.from_host,
                 "from_store": rep.from_store, "initialised": rep.initialised, "rows": rep.rows}
            )  # fmt: skip
        else:
            worker = threading.Thread(target=self.stage, args=(ahead,))
            worker.start()
        loss_sum = 0.0
        model.train()
        world, rank = self.exchange.world_size, self.rank
        for b in range(data.num_batches):
            dense, keys, labels = data.batch(b)
            size = len(labels)  # the global batch; this rank trains its share of it
            lo, hi = rank * size // world, (rank + 1) * size // world
            dense, keys, labels = dense[lo:hi], keys[lo:hi], labels[lo:hi]
            # the trainer's own step (one rank: the exchange and all-reduce are local)
            loss_sum += train_step(
                model,
                opt,
                ex,
                self.lookup,
                self.apply_gradients,
                (dense, keys, None, labels),
                global_size=size,
                lr=None,
                grad_clip_norm=None,
                pooling=None,
                times=t,
            )
        t["dense_step"] = t.pop("dense_sync_step", 0.0)  # one rank: no sync, only the step
        t0 = time.perf_counter()
        with self.lock:
            table.unpin()
        t["unpin"] = time.perf_counter() - t0
        if worker is not None and ahead is not None:
            t0 = time.perf_counter()
            worker.join()
            self.stage(ahead)  # re-pin after the unpin, as the trainer does
            t["stage"] = time.perf_counter() - t0
        if self.flush_each_pass:
            t0 = time.perf_counter()
            table.flush()
            t["flush"] = time.perf_counter() - t0
        after = table.stats()["rows_from"]
        self.sources.append({k: after[k] - before[k] for k in after})
        self.times.append(dict(t))
        self.losses.append(loss_sum / data.num_examples)


# -- plain PyTorch baseline --------------------------------------------------------------


class TorchSide:
    """The same DLRM over one flat ``nn.Embedding`` (sparse gradients, torch Adagrad); keys
    are mapped to rows by ``searchsorted`` over the sorted distinct keys, in the timing."""

    def __init__(self, distinct: torch.Tensor) -> None:
        self.index = distinct
        self.emb = nn.Embedding(len(distinct), DIM, sparse=True)
        with torch.no_grad():  # the same initial rows as the daskhps table
            spec = TableSpec("bench", dim=DIM)
            self.emb.weight.copy_(
                init_embedding(distinct, seed=spec.seed, dim=DIM, scale=spec.scale)
            )
        self.model = new_model()
        self.opt_sparse = torch.optim.Adagrad(self.emb.parameters(), lr=SPARSE_LR, eps=1e-8)
        self.opt_dense = torch.optim.Adam(self.model.parameters(), lr=DENSE_LR)
        self.losses: list[float] = []

    def train_pass(self, data: Pass) -> None:
        loss_sum = 0.0
        self.model.train()
        for b in range(data.num_batches):
            dense, keys, labels = data.batch(b)
            idx = torch.searchsorted(self.index, keys)
            logits = self.model(dense, self.emb(idx))
            loss = F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
            self.opt_sparse.zero_grad(set_to_none=True)
            self.opt_dense.zero_grad(set_to_none=False)
            (loss / len(labels)).backward()
            self.opt_sparse.step()
            self.opt_dense.step()
            loss_sum += float(loss.detach())
        self.losses.append(loss_sum / data.num_examples)


# -- the figures -------------------------------------------------------------------------


def emit_stages(rep: Reporter, label: str, side: DaskhpsSide, skip: int) -> None:
    times = side.times[skip:]
    per_pass = {s: statistics.median(t.get(s, 0.0) for t in times) for s in STAGES}
    total = sum(per_pass.values())
    for s in STAGES:
        if s == "flush" and not side.flush_each_pass:
            continue
        rep.emit(
            f"{label}: {s} per pass",
            per_pass[s],
            "s",
            share=round(per_pass[s] / total, 4) if total else 0.0,
        )


def bench_vs_torch(rep: Reporter, tmp: Path, data: Data, repeat: int) -> None:
    n = len(data.distinct)
    ours = DaskhpsSide.open(tmp / "fits", device_rows=n, host_bytes=0, flush_each_pass=False)
    piped = DaskhpsSide.open(tmp / "piped", device_rows=n, host_bytes=0, flush_each_pass=False)
    base = TorchSide(data.distinct)
    passes = data.passes
    it_ours, it_base, it_piped = (iter(range(10**9)) for _ in range(3))
    piped.stage(passes[0])

    def piped_pass() -> None:
        k = next(it_piped)
        piped.train_pass(passes[k % len(passes)], ahead=passes[(k + 1) % len(passes)])

    t = interleaved(
        {
            "daskhps": lambda: ours.train_pass(passes[next(it_ours) % len(passes)]),
            "torch": lambda: base.train_pass(passes[next(it_base) % len(passes)]),
            "pipelined": piped_pass,
        },
        repeat=repeat,
    )
    ex = passes[0].num_examples
    rep.emit(
        f"daskhps train step, 1 rank, table in memory ({n:,} keys), batch {data.batch_size}",
        ex / t["daskhps"],
        "examples/s",
        baseline=ex / t["torch"],
        baseline_name="plain PyTorch: flat nn.Embedding(sparse) + searchsorted, torch Adagrad",
        goal_ratio=1.0,
        loss_last_pass=round(ours.losses[-1], 5),
        baseline_loss_last_pass=round(base.losses[-1], 5),
    )
    rep.emit(
        "daskhps pipelined as the trainer runs it (pass k+1 staged on a second thread while "
        "pass k trains; unpin and re-pin in the pass), wall clock",
        ex / t["pipelined"],
        "examples/s",
        baseline=ex / t["torch"],
        baseline_name="plain PyTorch, as above",
        goal_ratio=1.0,
        loss_last_pass=round(piped.losses[-1], 5),
        repin_seconds_per_pass=round(statistics.median(x["stage"] for x in piped.times[1:]), 4),
    )
    stage = statistics.median(x["stage"] for x in ours.times[1:])
    rep.emit(
        "daskhps mini-batch loop only (derived: staging time subtracted)",
        ex / (t["daskhps"] - stage),
        "examples/s",
        baseline=ex / t["torch"],
        baseline_name="plain PyTorch, as above",
        stage_seconds_per_pass=round(stage, 4),
    )
    t0 = time.perf_counter()
    written = ours.table.flush()
    rep.emit("daskhps flush of the in-memory table (once, end of run)", time.perf_counter() - t0,
             "s", rows=written)  # fmt: skip
    emit_stages(rep, "in-memory run", ours, skip=1)
    emit_stages(rep, "pipelined in-memory run (stage = wait + re-pin)", piped, skip=1)
    ours.table.close()
    piped.table.close()


def bench_out_of_core(rep: Reporter, tmp: Path, data: Data, rounds: int) -> None:
    n = len(data.distinct)
    spec = TableSpec("bench", dim=DIM, optimizer=OptimizerSpec(kind="adagrad", lr=SPARSE_LR))
    working = max(int(torch.unique(p.keys).numel()) for p in data.passes)
    host_rows = n // 10
    host_bytes = 0
    step = max(host_rows * spec.row_bytes // 64, 1 << 12)
    while rows_for_bytes(spec.width, host_bytes) < host_rows:
        host_bytes += step
    roomy = DaskhpsSide.open(tmp / "roomy", device_rows=n, host_bytes=0, flush_each_pass=True)
    tight = DaskhpsSide.open(
        tmp / "tight", device_rows=working, host_bytes=host_bytes, flush_each_pass=True
    )
    pass_times: dict[str, list[float]] = {"roomy": [], "tight": []}
    passes = data.passes
    for _ in range(rounds):
        for p in passes:
            for name, side in (("roomy", roomy), ("tight", tight)):
                t0 = time.perf_counter()
                side.train_pass(p)
                pass_times[name].append(time.perf_counter() - t0)
    skip = len(passes)  # the first round fills the tiers (every key is new)
    ex = passes[0].num_examples
    t_roomy = statistics.median(pass_times["roomy"][skip:])
    t_tight = statistics.median(pass_times["tight"][skip:])
    hit = defaultdict(int)
    for s in tight.sources[skip:]:
        for k, v in s.items():
            hit[k] += v
    total = sum(hit.values()) or 1
    staged = defaultdict(int)
    for s in tight.staged[skip:]:
        for k, v in s.items():
            staged[k] += v
    rows = staged.pop("rows") or 1
    rep.emit(
        f"daskhps, table {n:,} keys = {n / host_rows:.0f}x its host tier "
        f"(device {working:,} rows = one pass)",
        ex / t_tight,
        "examples/s",
        baseline=ex / t_roomy,
        baseline_name="same run, every row in the device tier",
        goal_ratio=0.8,
        stage_from={k: round(v / rows, 4) for k, v in staged.items()},
        hit_rate={k: round(v / total, 4) for k, v in hit.items()},
        loss_last_pass=round(tight.losses[-1], 5),
        baseline_loss_last_pass=round(roomy.losses[-1], 5),
    )
    emit_stages(rep, "in-memory run (out-of-core baseline)", roomy, skip=skip)
    emit_stages(rep, "out-of-core run", tight, skip=skip)
    roomy.table.close()
    tight.table.close()


def _rank_main(rank: int, world: int, root: str, cfg: dict, rounds: int) -> None:
    """One rank of the multi-process figure: train every pass ``rounds`` times, save the
    seconds per pass (rank 0) and the summed loss of its share."""
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    torch.set_num_threads(2 // world)
    data = make_data(**cfg, zipf=1.05, seed=1)
    comm = Comm.create(rank, world, init_method=f"file://{root}/store", timeout_s=300)
    side = DaskhpsSide.open(
        Path(root) / f"rank-{rank}",
        device_rows=len(data.distinct),
        host_bytes=0,
        flush_each_pass=False,
        comm=comm,
    )
    seconds = []
    for _ in range(rounds):
        for p in data.passes:
            t0 = time.perf_counter()
            side.train_pass(p)
            seconds.append(time.perf_counter() - t0)
    side.table.close()
    comm.close()
    torch.save({"seconds": seconds, "losses": side.losses}, Path(root) / f"out-{rank}.pt")


def bench_ranks(rep: Reporter, tmp: Path, cfg: dict, data: Data, repeat: int) -> None:
    times: dict[int, list[float]] = {1: [], 2: []}
    losses: dict[int, float] = {}
    for i in range(repeat):
        for world in (1, 2):
            root = tmp / f"ranks-{world}-{i}"
            root.mkdir()
            mp.spawn(_rank_main, args=(world, str(root), cfg, 2), nprocs=world, join=True)
            outs = [torch.load(root / f"out-{r}.pt") for r in range(world)]
            times[world] += outs[0]["seconds"][len(data.passes) :]  # round 1 fills the table
            losses[world] = sum(o["losses"][-1] for o in outs)
    ex = data.passes[0].num_examples
    t1, t2 = statistics.median(times[1]), statistics.median(times[2])
    rep.emit(
        "daskhps, 2 ranks (2 processes, gloo, 1 torch thread each), same global batches, "
        "staging included",
        ex / t2,
        "examples/s",
        baseline=ex / t1,
        baseline_name="1 rank, 1 process, 2 torch threads",
        loss_last_pass=round(losses[2], 5),
        baseline_loss_last_pass=round(losses[1], 5),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not figures)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message="Sparse invariant checks")  # torch's Adagrad
    if args.threads:
        torch.set_num_threads(args.threads)
    rep = Reporter(args.json)
    if args.quick:
        cfg = {"vocab": 20_000, "batch": 512, "batches_per_pass": 3, "passes": 2}
        repeat, rounds, ooc_passes, ooc_vocab = 1, 2, 2, 30_000
    else:
        cfg = {"vocab": 1_000_000, "batch": 4096, "batches_per_pass": 10, "passes": 3}
        repeat, rounds, ooc_passes, ooc_vocab = 5, 3, 3, 2_000_000
    with tempfile.TemporaryDirectory(prefix="bench_train-") as d:
        tmp = Path(d)
        data = make_data(**cfg, zipf=1.05, seed=1)
        bench_vs_torch(rep, tmp, data, repeat)
        ooc = make_data(
            ooc_vocab, cfg["batch"], cfg["batches_per_pass"], ooc_passes, zipf=0.9, seed=2
        )
        bench_out_of_core(rep, tmp, ooc, rounds)
        bench_ranks(rep, tmp, cfg, data, repeat=1 if args.quick else 3)
    return 0


if __name__ == "__main__":
    sys.exit(main())

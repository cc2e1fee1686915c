"""Holdout quality of daskhps against a plain-PyTorch baseline on generated click logs.

    python scripts/bench_quality.py [--json] [--quick] [--workers N ...] [--epochs E]

Generates two days of synthetic Criteo-format logs (``daskhps.data.synthetic``), trains daskhps
with :class:`~daskhps.training.trainer.Trainer` on an embedded LocalCluster on day 1 and
evaluates on day 2 (``holdout.day: last``). The baseline is the same DLRM trained in one
process on the same day-1 rows, in the same order (the plan's order: files sorted by path,
rows in file order, passes cut as the plan cuts them, no shuffle), with the same global batch
size, epochs, learning rates and optimizers: one flat ``nn.Embedding(sparse=True)`` updated by
``torch.optim.Adagrad``, keys mapped to rows by ``searchsorted`` over the sorted distinct keys,
and the config's dense optimizer, schedule and gradient clipping.

Both sides start from the same embedding rows (``init_embedding`` with the table's seed and
scale; a holdout key never trained keeps its initial row on both sides, as a read-only lookup
gives) and the same dense weights (``torch.manual_seed(run.seed)`` before building the model,
as each worker does), so the comparison measures the system, not the luck of initialisation.

Figure: daskhps's holdout AUC against the baseline's (goal: at least the baseline's - 0.002),
with logloss and the generator's ceiling AUC (the AUC of the planted model itself).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _real_logs as real
from _bench import Reporter

from daskhps.config import RunConfig
from daskhps.data.holdout import read_train_and_holdout
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.passes import build_plan
from daskhps.table.init import init_embedding
from daskhps.training.examples import RANK, WorkerExamples
from daskhps.training.metrics import evaluate_predictions
from daskhps.training.trainer import Trainer

GOAL_AUC_GAP = 0.002

# The full run mirrors configs/quickstart.yaml (data, batch, table, model, dense optimizer).
FULL = {
    "gen": {"days": 2, "rows_per_day": 200_000, "parts_per_day": 4, "vocab_scale": 0.1},
    "epochs": 2,
    "examples_per_pass": 100_000,
    "batch": 4096,
    "dim": 16,
    "model": {"bottom_mlp": [64, 16], "top_mlp": [64, 32]},
    "warmup_steps": 20,
    "memory_limit": "2GiB",
}
QUICK = {
    "gen": {"days": 2, "rows_per_day": 8_000, "parts_per_day": 2, "vocab_scale": 0.005},
    "epochs": 2,
    "examples_per_pass": 4_000,
    "batch": 256,
    "dim": 8,
    "model": {"bottom_mlp": [16, 8], "top_mlp": [16]},
    "warmup_steps": 5,
    "memory_limit": "1GiB",
}


def make_logs(out: Path, sizes: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Generate the logs into ``out``; returns ``generation.json``."""
    generate(GeneratorConfig(seed=seed, **sizes["gen"]), str(out))
    return json.loads((out / "generation.json").read_text())


def ceiling_of(generation: dict[str, Any], day: str | None) -> float:
    """The generator's ceiling AUC on ``day`` where it reports one, else over all days."""
    per_day = generation.get("days", {}).get(day or "", {})
    return float(per_day.get("ceiling_auc", generation["ceiling_auc"]))


def make_config(
    logs: Path, run_dir: Path, sizes: dict[str, Any], *, workers: int, seed: int = 0
) -> RunConfig:
    """A run on ``logs`` shaped like the quickstart: day 1 trains, the last day is held out."""
    return RunConfig.from_dict(
        {
            "run": {"name": "quality", "dir": str(run_dir), "seed": seed, "quiet": True},
            "data": {"train": {"paths": [str(logs)]}, "holdout": {"day": "last"}},
            "passes": {
                "epochs": sizes["epochs"],
                "examples_per_pass": sizes["examples_per_pass"],
                "global_batch_size": sizes["batch"],
                "num_shards": 16,
                "shuffle_examples": False,  # the baseline replays the plan's order
            },
            "table": {
                "dim": sizes["dim"],
                "optimizer": {"kind": "adagrad", "lr": 0.05},
                "tiers": {"device": {"fraction": 0.1}, "host": {"fraction": 0.1}},
            },
            "model": {"name": "dlrm", "options": sizes["model"]},
            "dense_optimizer": {
                "kind": "adam",
                "lr": 1.0e-3,
                "schedule": "warmup_constant",
                "warmup_steps": sizes["warmup_steps"],
                "grad_clip_norm": 10.0,
            },
            "cluster": {
                "n_workers": workers,
                "threads_per_worker": 2,
                "memory_limit": sizes["memory_limit"],
                "gpu": False,
                "dashboard_address": None,
            },
        },
        source="bench_quality",
    )


def run_daskhps(cfg: RunConfig) -> dict[str, Any]:
    """Train with the Trainer; the holdout metrics after the last pass, and seconds."""
    t0 = time.perf_counter()
    res = Trainer(cfg, progress=False).run()
    return {**res.final_eval, "seconds": time.perf_counter() - t0, "passes": len(res.passes)}


def _examples(frame: pd.DataFrame, cfg: RunConfig) -> WorkerExamples:
    """Rows as the tensors a worker builds from them (one global batch: cut by the caller)."""
    df = frame.reset_index(drop=True).assign(**{RANK: np.arange(len(frame), dtype=np.int64)})
    ex = WorkerExamples.from_frame(df, cfg.data.schema, max(len(df), 1), 1)
    if ex.offsets is not None:
        raise NotImplementedError("bench_quality: the baseline covers single-hot schemas only")
    return ex


def _dense_optimizer(cfg: RunConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """The config's dense optimizer, built as the workers build it."""
    o = cfg.dense_optimizer
    kinds = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}
    return kinds[o.kind](params, lr=o.lr, weight_decay=o.weight_decay)


def _sparse_optimizer(cfg: RunConfig, emb: nn.Embedding) -> torch.optim.Optimizer:
    """torch's optimizer with the table optimizer's hyper-parameters."""
    s = cfg.table.optimizer
    if s.kind == "adagrad" and not s.row_wise:
        return torch.optim.Adagrad(
            emb.parameters(), lr=s.lr, eps=s.eps, initial_accumulator_value=s.initial_accumulator
        )
    if s.kind == "sgd":
        return torch.optim.SGD(emb.parameters(), lr=s.lr)
    raise NotImplementedError(f"bench_quality: no torch baseline for table optimizer {s.kind!r}")


def run_baseline(cfg: RunConfig) -> dict[str, Any]:
    """Train and evaluate the plain-PyTorch baseline of ``cfg`` in this process."""
    warnings.filterwarnings("ignore", message="Sparse invariant checks")  # torch's Adagrad
    t0 = time.perf_counter()
    train_log, held_log = read_train_and_holdout(
        cfg.data.source, cfg.data.holdout, cfg.data.backend
    )
    assert held_log is not None, "bench_quality needs a holdout"
    train_log = train_log.persist()
    # The Trainer's own plan (1 worker: the cut into passes does not depend on the count).
    plan = build_plan(train_log, cfg.passes.plan, 1, seed=cfg.run.seed)
    train = _examples(train_log.frame.compute(), cfg)
    held = _examples(held_log.frame.compute(), cfg)

    spec = cfg.table_spec()
    if spec.dim != cfg.table.dim:
        raise NotImplementedError("bench_quality: the baseline covers models without extra columns")
    index = torch.unique(torch.cat([train.keys.reshape(-1), held.keys.reshape(-1)]))
    emb = nn.Embedding(len(index), spec.dim, sparse=True)
    with torch.no_grad():  # the rows the daskhps table initialises each key with
        emb.weight.copy_(init_embedding(index, seed=spec.seed, dim=spec.dim, scale=spec.scale))
    torch.manual_seed(cfg.run.seed)  # the dense weights every worker starts from
    schema = cfg.data.schema
    model = cfg.model.build(
        num_dense=len(schema.dense_names),
        num_fields=len(schema.categorical_names),
        embedding_dim=cfg.table.dim,
    )
    opt_sparse = _sparse_optimizer(cfg, emb)
    opt_dense = _dense_optimizer(cfg, list(model.parameters()))
    o = cfg.dense_optimizer
    B = cfg.passes.plan.global_batch_size
    schedule = [p for _ in range(cfg.passes.epochs) for p in plan.passes]
    total_steps = sum(p.num_batches for p in schedule)
    step = 0
    model.train()
    for p in schedule:
        # Batches are cut inside each pass, as the Trainer cuts them (the last may be short).
        for lo in range(p.start, p.stop, B):
            hi = min(lo + B, p.stop)
            keys, labels = train.keys[lo:hi], train.labels[lo:hi]
            logits = model(train.dense[lo:hi], emb(torch.searchsorted(index, keys)))
            loss = F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
            opt_sparse.zero_grad(set_to_none=True)
            opt_dense.zero_grad(set_to_none=False)
            (loss / (hi - lo)).backward()
            opt_sparse.step()
            if o.grad_clip_norm:
                nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip_norm)
            for group in opt_dense.param_groups:
                group["lr"] = o.lr * o.lr_factor(step, total_steps)
            opt_dense.step()
            step += 1
    model.eval()
    preds = []
    eb = cfg.eval.batch_size
    with torch.no_grad():
        for lo in range(0, held.num_examples, eb):
            keys = torch.searchsorted(index, held.keys[lo : lo + eb])
            preds.append(torch.sigmoid(model(held.dense[lo : lo + eb], emb(keys))))
    pred = torch.cat(preds).numpy()
    out = evaluate_predictions(pred, held.labels.numpy(), cfg.eval.metrics)
    return {**out, "seconds": time.perf_counter() - t0, "steps": step}


def compare(
    logs: Path, work: Path, sizes: dict[str, Any], *, workers: int, seed: int = 0
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(daskhps, baseline) holdout metrics of the same run."""
    cfg = make_config(logs, work / f"run-w{workers}", sizes, workers=workers, seed=seed)
    return run_daskhps(cfg), run_baseline(cfg)


def real_logs(
    samples: list[str], seeds: int, rep: Reporter, overrides: tuple[str, ...] = ()
) -> None:
    """daskhps's defaults against the plain-PyTorch peers on real logs (scripts/_real_logs.py):
    each side's holdout AUC and NE, the mean over ``seeds`` seeds (both sides seeded alike)."""
    for given in samples:
        name, _, file = given.partition("=")
        if name not in real.SOURCES:
            raise SystemExit(f"--real {given}: no such log; known: {', '.join(real.SOURCES)}")
        with tempfile.TemporaryDirectory(prefix=f"bench_quality-{name}-") as d:
            work = Path(d)
            sample = Path(file) if file else real.fetch(name, work / "sample")
            train, holdout, rows, held = real.split(name, sample, work / "logs")
            ours: list[dict[str, Any]] = []
            theirs: dict[str, list[dict[str, Any]]] = {k: [] for k in real.PEERS}
            for seed in range(seeds):
                run = work / f"run-{seed}"
                cfg = real.daskhps_config(name, work / "logs", run, seed, rows, overrides)
                res = Trainer(cfg, progress=False).run()
                ours.append({**res.model_eval, "passes": len(res.passes), "stopped": res.stopped})
                for peer, out in real.peers(name, train, holdout, seed).items():
                    theirs[peer].append(out)
            mean = {k: float(np.mean([o[k] for o in ours])) for k in ("auc", "ne", "logloss")}
            peer_auc = {k: float(np.mean([o["auc"] for o in v])) for k, v in theirs.items()}
            best = max(peer_auc, key=lambda k: peer_auc[k])
            peer_ne = float(np.mean([o["ne"] for o in theirs[best]]))
            rep.emit(
                f"{name} ({rows:,} training rows, {held:,} holdout rows, time order): daskhps "
                f"defaults' model, holdout AUC, mean of {seeds} seeds",
                mean["auc"],
                "AUC",
                baseline=peer_auc[best],
                baseline_name=f"plain PyTorch DLRM ({best}), its best epoch",
                auc_difference=round(mean["auc"] - peer_auc[best], 5),
                ne=round(mean["ne"], 4),
                baseline_ne=round(peer_ne, 4),
                goal="AUC >= the best peer's, NE < 1",
                goal_met=bool(mean["auc"] >= peer_auc[best] and mean["ne"] < 1.0),
                daskhps_auc_by_seed=[round(o["auc"], 4) for o in ours],
                daskhps_stopped=[(o["stopped"] or {}).get("kind") for o in ours],
                peers_auc={k: round(v, 4) for k, v in peer_auc.items()},
                peers_auc_by_seed={k: [round(o["auc"], 4) for o in v] for k, v in theirs.items()},
                peers_best_epoch={k: [o["best_epoch"] for o in v] for k, v in theirs.items()},
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not figures)")
    p.add_argument("--workers", type=int, nargs="+", default=[1], help="worker counts to run")
    p.add_argument("--epochs", type=int, default=None, help="epochs (default: 2)")
    p.add_argument(
        "--real",
        nargs="+",
        metavar="NAME[=FILE]",
        help="real logs instead (criteo, avazu): the sample FILE, or downloaded",
    )
    p.add_argument("--seeds", type=int, default=3, help="--real: seeds per side")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="--real: daskhps's config changed so (another default tried)",
    )
    args = p.parse_args(argv)
    if args.real:
        real_logs(args.real, args.seeds, Reporter(args.json), tuple(args.set))
        return 0
    sizes = dict(QUICK if args.quick else FULL)
    if args.epochs:
        sizes["epochs"] = args.epochs
    rep = Reporter(args.json)
    with tempfile.TemporaryDirectory(prefix="bench_quality-") as d:
        work = Path(d)
        generation = make_logs(work / "logs", sizes)
        days = sorted(generation.get("days", {}))
        ceiling = ceiling_of(generation, days[-1] if days else None)
        rows = sizes["gen"]["rows_per_day"]
        for w in args.workers:
            ours, base = compare(work / "logs", work, sizes, workers=w)
            gap = ours["auc"] - base["auc"]
            rep.emit(
                f"daskhps holdout AUC, {w} worker(s), {sizes['epochs']} epochs on {rows:,} rows",
                ours["auc"],
                "AUC",
                baseline=base["auc"],
                baseline_name="plain PyTorch: flat nn.Embedding(sparse) + searchsorted, "
                "torch Adagrad, same rows, order and initial weights",
                auc_difference=round(gap, 5),
                goal=f"difference >= -{GOAL_AUC_GAP}",
                goal_met=bool(gap >= -GOAL_AUC_GAP),
                ceiling_auc=round(ceiling, 4),
                logloss=round(ours["logloss"], 5),
                baseline_logloss=round(base["logloss"], 5),
                daskhps_seconds=round(ours["seconds"], 1),
                baseline_seconds=round(base["seconds"], 1),
            )
        rep.emit("generator ceiling AUC (planted model) on the holdout day", ceiling, "AUC")
    return 0


if __name__ == "__main__":
    sys.exit(main())

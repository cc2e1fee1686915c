"""The driver of a training run: cluster, shards, process group, then pass after pass.

One pass, as the driver sees it::

    plan keys of pass k ──shuffle to owners──► stage into each owner's device tier (pinned)
    route examples of pass k to the worker that trains them
    all ranks: mini-batch loop (daskhps.training.worker.train_pass), synchronous
    unpin ─► evaluate on the holdout (read-only lookups) ─► metrics.jsonl line
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from daskhps.config import RunConfig
from daskhps.data.readers import ClickLog
from daskhps.distributed import (
    ShardHost,
    TierSizing,
    close_shards,
    commit_shards,
    init_comm,
    local_shards,
    open_shards,
    run_pinned,
    shard_stats,
    stage_shards,
    start_cluster,
)
from daskhps.distributed.cluster import ClusterHandle
from daskhps.distributed.comm import CommGroup
from daskhps.passes import PassPlan, build_plan, place_on_workers, plan_owner_keys
from daskhps.sharding import ShardMap
from daskhps.training import worker
from daskhps.training.examples import route_examples
from daskhps.training.holdout import read_train_and_holdout
from daskhps.training.metrics import evaluate_predictions

__all__ = ["RunResult", "Trainer"]

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a finished run leaves behind (also written to ``summary.json``)."""

    run_dir: Path
    passes: list[dict[str, Any]] = field(default_factory=list)
    final_eval: dict[str, float] = field(default_factory=dict)
    dense_state: dict[str, Any] = field(default_factory=dict)

    @property
    def pass_losses(self) -> list[float]:
        return [p["train_loss"] for p in self.passes]


def _unpin(table: str) -> None:
    local_shards().unpin(table)


class Trainer:
    """Runs one training job described by a :class:`RunConfig`."""

    def __init__(self, config: RunConfig, *, progress: bool | None = None) -> None:
        self.config = config
        self.run_dir = Path(config.run.dir)
        self.progress = (not config.run.quiet) if progress is None else progress
        self.run_id = f"{config.run.name}-{uuid.uuid4().hex[:8]}"

    # -- setup -------------------------------------------------------------------

    def _start_cluster(self) -> ClusterHandle:
        c = self.config.cluster
        return start_cluster(
            address=c.address,
            n_workers=c.n_workers if c.address is None else None,
            threads_per_worker=c.threads_per_worker,
            memory_limit=c.memory_limit if c.memory_limit is not None else "auto",
            processes=c.processes,
            gpus=c.gpu if c.gpu in (True, False, "auto") else "auto",  # type: ignore[arg-type]
            dashboard_address=c.dashboard_address,
        )

    def _sizing(self) -> TierSizing:
        tiers = self.config.table.tiers
        return TierSizing(
            device_fraction=tiers.device.fraction if tiers.device.rows is None else None,
            device_rows=tiers.device.rows,
            host_fraction=tiers.host.fraction or None,
        )

    # -- the run -----------------------------------------------------------------

    def run(self) -> RunResult:
        cfg = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(cfg.to_yaml())
        if cfg.data.generate is not None:
            cfg.data.generate.ensure(progress=self.progress)
        stores = Path(cfg.table.tiers.store_dir)
        if stores.exists():
            log.warning("starting a new run: removing the stores of an earlier run in %s", stores)
            shutil.rmtree(stores)
        result = RunResult(self.run_dir)
        # Read (lazily) before the cluster starts: paths that match nothing fail in a second.
        logs = read_train_and_holdout(cfg.data.source, cfg.data.holdout, cfg.data.backend)
        with self._start_cluster() as handle:
            if handle.dashboard_link:
                log.info("dashboard: %s", handle.dashboard_link)
            addresses = list(handle.addresses)
            client = handle.client
            spec = cfg.table_spec()
            host = ShardHost(
                [spec],
                stores,
                addresses,
                self._sizing(),
                policy=cfg.table.tiers.policy,  # type: ignore[arg-type]
                mode="a",
            )
            group = init_comm(
                client,
                addresses,
                backend=None if cfg.cluster.dist_backend == "auto" else cfg.cluster.dist_backend,
                timeout_s=cfg.cluster.dist_timeout_s,
            )
            try:
                open_shards(client, host)
                self._train(client, group, addresses, logs, result)
            finally:
                try:
                    close_shards(client, addresses)
                finally:
                    group.close()
        (self.run_dir / "summary.json").write_text(json.dumps(self._summary(result), indent=2))
        return result

    def _train(
        self,
        client: Any,
        group: CommGroup,
        addresses: list[str],
        logs: tuple[ClickLog, ClickLog | None],
        result: RunResult,
    ) -> None:
        cfg = self.config
        W = len(addresses)
        table = cfg.table.name
        train_log, holdout_log = logs
        train_log = train_log.persist()
        plan = build_plan(train_log, cfg.passes.plan, W, seed=cfg.run.seed)
        bad_rows = train_log.compute_report().to_dict()
        holdout = self._place_holdout(client, holdout_log, addresses) if holdout_log else None
        shard_map = ShardMap(cfg.passes.plan.num_shards, W)
        opt = cfg.dense_optimizer
        setup = worker.TrainSetup(
            run_id=self.run_id,
            table=table,
            schema=cfg.data.schema,
            model=cfg.model,
            embedding_dim=cfg.table.dim,
            num_shards=shard_map.num_shards,
            seed=cfg.run.seed,
            optimizer=opt.kind,
            lr=opt.lr,
            weight_decay=opt.weight_decay,
            grad_clip_norm=opt.grad_clip_norm,
        )
        group.run(worker.setup_trainer, setup, what="build dense replicas")
        total_steps = cfg.passes.epochs * sum(p.num_batches for p in plan.passes)
        step = 0
        metrics_path = self.run_dir / "metrics.jsonl"
        metrics_path.write_text("")
        bar = tqdm(total=total_steps, unit="batch", disable=not self.progress, desc="training")
        try:
            for epoch in range(cfg.passes.epochs):
                for spec in plan.passes:
                    rec = self._one_pass(
                        client,
                        group,
                        addresses,
                        train_log,
                        plan,
                        spec,
                        shard_map,
                        step,
                        total_steps,
                        holdout,
                    )
                    rec.update(epoch=epoch, bad_rows_skipped=bad_rows if not result.passes else {})
                    step += spec.num_batches
                    bar.update(spec.num_batches)
                    bar.set_postfix(
                        loss=f"{rec['train_loss']:.4f}", auc=rec.get("eval", {}).get("auc")
                    )
                    result.passes.append(rec)
                    with metrics_path.open("a") as f:
                        f.write(json.dumps(rec) + "\n")
        finally:
            bar.close()
        commit_shards(client, addresses, "end", {"passes": len(result.passes)})
        if result.passes:
            result.final_eval = result.passes[-1].get("eval", {})
        result.dense_state = group.run(worker.model_state, self.run_id, what="dense weights")[0]
        group.run(worker.drop_trainer, self.run_id, what="drop dense replicas")

    def _place_holdout(self, client: Any, holdout: ClickLog, addresses: list[str]) -> dict:
        holdout = holdout.persist()
        lengths = holdout.frame.map_partitions(len).compute().tolist()
        n = int(sum(lengths))
        W = len(addresses)
        bs = self.config.eval.batch_size * W
        routed = route_examples(
            holdout.frame, lengths, 0, n, batch_size=bs, num_workers=W, order=None
        )
        placed = place_on_workers(client, routed, addresses)
        return {"futures": placed.futures, "batch_size": bs, "num_batches": -(-n // bs), "n": n}

    def _one_pass(
        self,
        client: Any,
        group: CommGroup,
        addresses: list[str],
        train_log: ClickLog,
        plan: PassPlan,
        spec: Any,
        shard_map: ShardMap,
        step: int,
        total_steps: int,
        holdout: dict | None,
    ) -> dict[str, Any]:
        cfg = self.config
        table = cfg.table.name
        B = cfg.passes.plan.global_batch_size
        seconds: dict[str, float] = {}
        t = time.perf_counter()
        owned = plan_owner_keys(train_log, plan, spec, shard_map)
        keys = place_on_workers(client, owned, addresses)
        reports = stage_shards(client, addresses, table, keys.futures)
        seconds["plan_shuffle_stage"] = time.perf_counter() - t
        t = time.perf_counter()
        routed = route_examples(
            train_log.frame,
            plan.partition_lengths,
            spec.start,
            spec.stop,
            batch_size=B,
            num_workers=len(addresses),
            order=spec.order() if spec.shuffled else None,
        )
        examples = place_on_workers(client, routed, addresses)
        seconds["route_examples"] = time.perf_counter() - t
        opt = cfg.dense_optimizer
        info = {
            "batch_size": B,
            "num_batches": spec.num_batches,
            "num_examples": spec.num_examples,
            "lr": [opt.lr * opt.lr_factor(step + b, total_steps) for b in range(spec.num_batches)],
        }
        t = time.perf_counter()
        outs = group.run(
            worker.train_pass,
            self.run_id,
            info,
            rank_args=[(f,) for f in examples.futures],
            what="train pass",
        )
        seconds["train"] = train_s = time.perf_counter() - t
        run_pinned(client, addresses, _unpin, table, what="unpin")
        loss_sum = sum(o["loss_sum"] for o in outs)
        rec: dict[str, Any] = {
            "pass": spec.index,
            "examples": spec.num_examples,
            "examples_per_s": spec.num_examples / train_s if train_s else 0.0,
            "train_loss": loss_sum / spec.num_examples,
            "batch_losses": [
                sum(o["batch_loss_sums"][b] for o in outs) / min(B, spec.num_examples - b * B)
                for b in range(spec.num_batches)
            ],
            "rows_staged": int(sum(r.rows for r in reports)),
            "staged_from": {
                "device": int(sum(r.from_device for r in reports)),
                "host": int(sum(r.from_host for r in reports)),
                "store": int(sum(r.from_store for r in reports)),
                "init": int(sum(r.initialised for r in reports)),
            },
            "worker_seconds": {
                k: max(o["seconds"].get(k, 0.0) for o in outs) for k in outs[0]["seconds"]
            },
        }
        if holdout is not None and cfg.eval.every_pass:
            t = time.perf_counter()
            rec["eval"] = self._evaluate(group, holdout)
            seconds["eval"] = time.perf_counter() - t
        stats = shard_stats(client, addresses)
        rec["tiers"] = _tier_summary(stats, table)
        rec["seconds"] = seconds
        return rec

    def _evaluate(self, group: CommGroup, holdout: dict) -> dict[str, float]:
        info = {"batch_size": holdout["batch_size"], "num_batches": holdout["num_batches"]}
        outs = group.run(
            worker.eval_pass,
            self.run_id,
            info,
            rank_args=[(f,) for f in holdout["futures"]],
            what="evaluate",
        )
        pred = np.concatenate([o[0] for o in outs])
        label = np.concatenate([o[1] for o in outs])
        return evaluate_predictions(pred, label, self.config.eval.metrics)

    def _summary(self, result: RunResult) -> dict[str, Any]:
        return {
            "run": self.config.run.name,
            "passes": len(result.passes),
            "examples": int(sum(p["examples"] for p in result.passes)),
            "final_train_loss": result.passes[-1]["train_loss"] if result.passes else None,
            "final_eval": result.final_eval,
            "examples_per_s": (
                float(np.mean([p["examples_per_s"] for p in result.passes]))
                if result.passes
                else None
            ),
        }


def _tier_summary(stats: list[dict[str, Any]], table: str) -> dict[str, Any]:
    """Hit rates and store traffic of one table, summed over workers."""
    rows_from: dict[str, int] = {}
    store_read = store_written = 0
    for s in stats:
        t = s["tables"][table]
        for k, v in t.get("rows_from", {}).items():
            rows_from[k] = rows_from.get(k, 0) + int(v)
        store_read += int(t.get("store", {}).get("rows_read", 0))
        store_written += int(t.get("store", {}).get("rows_written", 0))
    total = sum(rows_from.values())
    return {
        "rows_from": rows_from,
        "hit_rate": {k: (v / total if total else 0.0) for k, v in rows_from.items()},
        "store_rows_read": store_read,
        "store_rows_written": store_written,
    }

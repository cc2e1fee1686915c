"""What a training run builds from its config: one method per component, so a test can check
without a cluster that every key reaches its component and none is lost
(``tests/config/test_every_key_lands.py``).

::

    RunConfig ─► RunParts ─► start_cluster(**cluster_args())      cluster.*
                          ─► RunGroup.start(**comm_args())         cluster.dist_*
                          ─► worker_shards(stores, commit)         table, tables
                          ─► train_setup()                         model, dense_optimizer, schema
                          ─► schedule(plan), batches(spec, ...)    passes, dense_optimizer.lr
                          ─► replica()                             checkpoint.replicate_to
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from daskhps import _forkserver as forkserver
from daskhps.config import RunConfig
from daskhps.distributed import WorkerShards, start_cluster
from daskhps.distributed.cluster import ClusterHandle
from daskhps.distributed.configured import cluster_args
from daskhps.passes import PassPlan, PassSpec
from daskhps.runfiles.replica import Replica
from daskhps.training import worker
from daskhps.training.holdout import HoldoutStream
from daskhps.training.metrics import evaluate_predictions
from daskhps.training.records import Batches

__all__ = ["RunParts"]


class RunParts:
    """The components of one run of ``config`` (``run_id`` names its dense replicas)."""

    def __init__(self, config: RunConfig, run_id: str) -> None:
        self.config = config
        self.run_id = run_id

    def cluster_args(self) -> dict[str, Any]:
        """The arguments of :func:`start_cluster` (``cluster.*``)."""
        return cluster_args(self.config)

    def start_cluster(self) -> ClusterHandle:
        return start_cluster(**self.cluster_args())

    def warm_up_workers(self) -> None:
        """The embedded CPU cluster's workers are forked from a server that imports their
        code once: start it now, so that its imports overlap the checks before the cluster."""
        forkserver.warm_up_for(self.config.cluster)

    def comm_args(self) -> dict[str, Any]:
        """The process group's arguments of :meth:`RunGroup.start` (``cluster.dist_*``)."""
        c = self.config.cluster
        return {
            "backend": None if c.dist_backend == "auto" else c.dist_backend,
            "timeout_s": c.dist_timeout_s,
        }

    def recovery_args(self) -> dict[str, Any]:
        """How the run recovers from a lost worker (``cluster.max_restarts``,
        ``cluster.restart_wait_s``)."""
        c = self.config.cluster
        return {"max_restarts": c.max_restarts, "wait_s": c.restart_wait_s}

    def worker_shards(self, stores: Path, commit: str | None) -> WorkerShards:
        """What holds every rank's shard of the config's tables in ``stores``, opened at
        ``commit`` (None: new tables), tiered as ``table.tiers`` says, each table with its
        own admission and expiry."""
        cfg = self.config
        tables = cfg.embedding_tables()
        shards = cfg.passes.plan.num_shards
        return WorkerShards(
            cfg.table_specs(),
            stores,
            cfg.tier_sizing(),
            policy=cfg.table.tiers.policy,
            store=cfg.table.tiers.store,
            mode="a",
            commit=commit,
            admission={t.name: t.admission_rule for t in tables},
            expiry={t.name: t.expiry.rule(shards) for t in tables},
            tagged=cfg.several_tables,
        )

    def train_setup(self) -> worker.TrainSetup:
        """What every rank builds its dense replica from (model, dense optimizer, schema)."""
        return worker.TrainSetup.from_config(self.config, self.run_id)

    def schedule(self, plan: PassPlan) -> list[tuple[int, PassSpec]]:
        """``(epoch, pass)`` in training order: every pass of the plan, ``passes.epochs`` times."""
        return [(epoch, spec) for epoch in range(self.config.passes.epochs) for spec in plan.passes]

    def batches(self, spec: PassSpec, step: int, total_steps: int) -> Batches:
        """What every rank's mini-batch loop gets for one pass: batch size and learning rates."""
        opt = self.config.dense_optimizer
        return Batches(
            batch_size=self.config.passes.plan.global_batch_size,
            num_batches=spec.num_batches,
            num_examples=spec.num_examples,
            lrs=tuple(
                opt.lr * opt.lr_factor(step + b, total_steps) for b in range(spec.num_batches)
            ),
        )

    def holdout_batch_size(self, num_workers: int) -> int:
        """Holdout rows per evaluation step over all workers (``eval.batch_size`` each)."""
        return self.config.eval.batch_size * num_workers

    def evaluates_each_pass(self, holdout: HoldoutStream | None) -> bool:
        return holdout is not None and self.config.eval.every_pass

    def score(self, pred: np.ndarray, label: np.ndarray) -> dict[str, float]:
        return evaluate_predictions(pred, label, self.config.eval.measured)

    def replica(self) -> Replica | None:
        """The copy at ``checkpoint.replicate_to``; None without one."""
        return Replica.of(self.config)

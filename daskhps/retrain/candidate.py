"""Train one candidate: from the published version, on the new days, scored on the newest.

The candidate run is an ordinary training run of :class:`~daskhps.training.trainer.Trainer`
in its own folder ``<run.dir>/attempts/<id>/``, with three differences:

- its data are the plan's days, the newest one held out (``data.holdout.day``);
- it starts from the published version's checkpoint (*warm start*: the table stores reopened
  at that version's commit, the dense model and its optimizer state loaded), and scores that
  starting model on the held-out day before the first pass: the baseline, on the same rows;
- it appends to its base version's table stores (shared by every version trained from it;
  publishing gives a version a commit name of its own, see :mod:`daskhps.retrain.publish`).
  New stores go to ``<table.tiers.store_dir>/<attempt id>``, a path no other attempt uses:
  a run from scratch (nothing published) starts there, and so does a warm start on another
  number of workers (the trainer re-shards the base's rows beside that path). Nothing that a
  version uses is ever overwritten.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daskhps.config import DataConfig, HoldoutConfig, RunConfig
from daskhps.data.source import TrainLogs
from daskhps.distributed.cluster import KeptCluster
from daskhps.errors import CheckpointError
from daskhps.monitor.progress import Progress
from daskhps.retrain.days import DayPlan
from daskhps.runfiles.checkpoint import Checkpoint, load_checkpoint, model_checkpoint
from daskhps.runfiles.replica import Replica
from daskhps.training.changes import check_changes

__all__ = [
    "Candidate",
    "candidate_config",
    "check_warm_start",
    "chunk_data",
    "day_data",
    "train_candidate",
]

_GUARD_METRICS = ("auc", "logloss")
_ONLY_AT_THE_END = 1 << 30  # checkpoint.every_passes: a checkpoint after the last pass only


@dataclass(frozen=True)
class Candidate:
    """A trained candidate: its checkpoint and both models' metrics on the scored day."""

    checkpoint: Checkpoint  # the candidate run's model (its best by eval.best_by)
    metrics: dict[str, float]
    baseline: dict[str, float]
    diverged: str | None = None  # why its training diverged: never published


def _logs_paths(config: RunConfig) -> tuple[str, ...]:
    """Where the run's logs lie: ``data.train.paths``, or generated logs (``data.generate``),
    read as the day partitions they are, from ``out``."""
    if config.data.train is not None:
        return config.data.train.paths
    gen = config.data.generate
    assert gen is not None  # a config has exactly one of train and generate
    return (gen.out,)


def day_data(config: RunConfig, plan: DayPlan) -> DataConfig:
    """The data of a scheduled run: the plan's days, the newest held out and scored."""
    assert plan.eval_day is not None and plan.train
    return config.data.replace(
        train=TrainLogs(
            paths=_logs_paths(config), days=(plan.train[0], plan.eval_day), require_complete=True
        ),
        generate=None,
        holdout=HoldoutConfig(day=plan.eval_day),
    )


def chunk_data(config: RunConfig, files: tuple[str, ...]) -> DataConfig:
    """The data of a follower's step: one chunk's ``files``, scored before they are trained
    on (progressive validation: the starting model has not seen them)."""
    return config.data.replace(
        train=TrainLogs(paths=files), generate=None, holdout=HoldoutConfig(progressive=True)
    )


def candidate_config(
    config: RunConfig, data: DataConfig, attempt_dir: Path, stores_dir: str | Path
) -> RunConfig:
    """``config`` narrowed to one attempt: ``data`` (:func:`day_data`, :func:`chunk_data`),
    its own folder, ``stores_dir`` and copy location
    (``checkpoint.replicate_to``/attempts/<attempt>)."""
    metrics = tuple(config.eval.metrics) + tuple(
        m for m in _GUARD_METRICS if m not in config.eval.metrics
    )
    return dataclasses.replace(
        config,
        run=config.run.replace(dir=str(attempt_dir)),
        data=data,
        table=config.table.replace(tiers=config.table.tiers.replace(store_dir=str(stores_dir))),
        eval=config.eval.replace(metrics=metrics),
        checkpoint=config.checkpoint.replace(
            every_passes=_ONLY_AT_THE_END,
            # a copy location of its own: attempts never prune each other's copies
            replicate_to=(
                None
                if config.checkpoint.replicate_to is None
                else Replica.attempt_url(config.checkpoint.replicate_to, attempt_dir.name)
            ),
        ),
    )


def check_warm_start(base: Checkpoint, config: RunConfig) -> None:
    """Raise :class:`ConfigError` when ``config`` changed a key of ``base``'s config that a
    warm start must keep (see :mod:`daskhps.training.changes`)."""
    check_changes(base.config, config, "warm_start", base.path)


def train_candidate(
    config: RunConfig,
    data: DataConfig,
    attempt_dir: Path,
    base_checkpoint: str | None,
    *,
    echo: Callable[[str], None] | None = None,
    progress: Progress | None = None,
    cluster: KeptCluster | None = None,
) -> Candidate:
    """Train the candidate on ``data`` from ``base_checkpoint`` (None: from scratch), on
    ``cluster`` when given (started by the training, kept up for the caller)."""
    from daskhps.training.trainer import Trainer

    base = load_checkpoint(base_checkpoint) if base_checkpoint is not None else None
    cfg = candidate_config(
        config, data, attempt_dir, Path(config.table.tiers.store_dir) / attempt_dir.name
    )
    if base is not None:
        check_warm_start(base, cfg)
    trainer = Trainer(
        cfg,
        progress=progress,
        echo=echo,
        warm_start=base,
        eval_before=True,
        cluster=cluster,
    )
    result = trainer.run()
    ckpt = model_checkpoint(attempt_dir)
    if ckpt is None:
        raise CheckpointError(
            f"the candidate trained in {attempt_dir} left no complete checkpoint; "
            "nothing was published (see the run's log)"
        )
    baseline: dict[str, Any] = dict(result.initial_eval)
    stopped = result.stopped or {}
    diverged = stopped.get("why") if stopped.get("kind") == "diverged" else None
    return Candidate(ckpt, result.model_eval, baseline, diverged)

"""The ``passes``, ``dense_optimizer`` and ``eval`` sections: how training is cut and stepped."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from daskhps.options import Ctx, Int, Noun, Options, Problem, Seq, validate
from daskhps.passes.config import PassConfig

__all__ = ["METRICS", "DenseOptimizerConfig", "EvalConfig", "PassesConfig"]

Metric = Annotated[Literal["auc", "logloss", "ne", "calibration"], Noun("metric")]
METRICS: tuple[Any, ...] = get_args(get_args(Metric)[0])


class PassesConfig(PassConfig):
    """``epochs`` over the training rows, each cut into passes by :attr:`plan`."""

    epochs: Int = Field(1, ge=1)
    """Times every training row is trained on."""

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> PassesConfig:
        return validate(cls, d, ctx, "passes")

    @property
    def plan(self) -> PassConfig:
        """The options that plan passes (everything but ``epochs``)."""
        return PassConfig(**{k: getattr(self, k) for k in PassConfig.model_fields})


class DenseOptimizerConfig(Options):
    """The dense model's optimizer: torch ``kind`` with ``lr`` and ``weight_decay``, a learning
    rate ``schedule`` (see :meth:`lr_factor`) and optional gradient clipping by global norm."""

    kind: Literal["sgd", "adam", "adagrad"] = "adam"
    """Optimizer of the dense model."""
    lr: float = Field(1e-3, gt=0.0, allow_inf_nan=False)
    """Peak learning rate."""
    weight_decay: float = Field(0.0, ge=0.0)
    """Weight decay."""
    schedule: Literal["constant", "warmup_constant", "cosine"] = "constant"
    """Learning rate over the steps of the run."""
    warmup_steps: Int = Field(0, ge=0)
    """Linear warmup steps (not with `constant`)."""
    grad_clip_norm: float | None = Field(None, gt=0.0)
    """Clip the global gradient norm."""

    @model_validator(mode="after")
    def _warmup_fits_schedule(self) -> DenseOptimizerConfig:
        if self.schedule == "constant" and self.warmup_steps:
            raise Problem(
                "warmup_steps", "has no effect with schedule constant; use warmup_constant"
            )
        if self.schedule == "warmup_constant" and not self.warmup_steps:
            raise Problem("warmup_steps", "schedule warmup_constant needs warmup_steps >= 1")
        return self

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> DenseOptimizerConfig:
        return validate(cls, d, ctx, "dense_optimizer")

    def lr_factor(self, step: int, total_steps: int) -> float:
        """Multiplier of ``lr`` at optimizer step ``step`` (0-based) of ``total_steps``.

        Linear warmup from ``1 / warmup_steps`` to 1 over the first ``warmup_steps`` steps,
        then 1 (``warmup_constant``) or a cosine decay to 0 at ``total_steps`` (``cosine``).
        """
        if self.schedule == "constant":
            return 1.0
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "warmup_constant":
            return 1.0
        span = max(1, total_steps - self.warmup_steps)
        t = min(1.0, (step - self.warmup_steps) / span)
        return 0.5 * (1.0 + math.cos(math.pi * t))


class EvalConfig(Options):
    """Evaluation on ``data.holdout`` after every pass (``every_pass``) and at the end, with
    read-only lookups in batches of ``batch_size``. Without a holdout nothing is evaluated."""

    every_pass: bool = True
    """Evaluate after every pass (always at the end)."""
    batch_size: Int = Field(8192, ge=1)
    """Rows per evaluation batch on each worker. A batch's activations are held at once (about
    8 KiB a row for the quickstart's DLRM; `daskhps plan` measures the configured model);
    predictions do not depend on it."""
    metrics: Seq[Metric] = METRICS
    """Of `auc`, `logloss`, `ne`, `calibration` (`best_by`, and `logloss` while
    `diverge_factor` is set, are measured and recorded too)."""
    best_by: Annotated[Literal["auc", "logloss", "ne"], Noun("metric")] | None = "auc"
    """The run's model is its checkpoint with the best holdout value of this metric: what
    `predict`, `serve`, `export`, `inspect` and a retrain's publish take from the run, never
    removed by `checkpoint.keep`; null: its last checkpoint."""
    patience: Int | None = Field(None, ge=1)
    """Stop early after this many evaluations in a row without a better `best_by`; null:
    train every scheduled pass."""
    min_delta: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    """A holdout value counts as better only when it beats the best by more than this."""
    diverge_factor: float | None = Field(1.5, gt=1.0, allow_inf_nan=False)
    """The run stops as diverged (exit status 3, its best checkpoint kept) when the holdout
    logloss exceeds this many times its best so far; a training loss or holdout metric that
    is NaN or infinite always stops it; null: only those."""

    @field_validator("metrics")
    @classmethod
    def _once_each(cls, metrics: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(metrics)) != len(metrics):
            raise Problem("", "lists a metric twice")
        return metrics

    @model_validator(mode="after")
    def _patience_has_a_measure(self) -> EvalConfig:
        if self.patience is not None and self.best_by is None:
            raise Problem(
                "patience", "counts evaluations without a better best_by: set eval.best_by"
            )
        if self.patience is not None and not self.every_pass:
            raise Problem(
                "patience",
                "counts evaluations after each pass, but eval.every_pass is false: set "
                "every_pass: true, or leave patience out",
            )
        return self

    @property
    def measured(self) -> tuple[str, ...]:
        """The metrics each evaluation computes: ``metrics``, and what ``best_by`` and
        ``diverge_factor`` read (recorded beside them)."""
        wanted = [*self.metrics, self.best_by, "logloss" if self.diverge_factor else None]
        return tuple(dict.fromkeys(m for m in wanted if m is not None))

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> EvalConfig:
        return validate(cls, d, ctx, "eval")

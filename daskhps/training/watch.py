"""What the holdout says of a run, pass by pass: its best checkpoint, an early stop, divergence.

::

    each pass     train loss NaN/Inf ───────────────────────────────► diverged (not checkpointed)
    evaluated     a holdout metric NaN/Inf, or logloss > diverge_factor x its best ► diverged
                  better best_by (by more than min_delta) ──► the count since the best restarts
                  else one more; patience reached ──────────────────► stopped early
    checkpointed  better best_by than the best checkpoint's ──► it is the run's model

The run's model (``eval.best_by``) is the checkpoint with the best holdout value; each
checkpoint's manifest names it (``model``), retention never removes it, and the readers of a
run (predict, serve, export, inspect, a retrain's publish) take it
(:func:`daskhps.runfiles.checkpoint.model_checkpoint`). Everything here is a pure function of
the pass records, so a resume rebuilds the same watch from ``metrics.jsonl``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from daskhps.config import RunConfig
from daskhps.config.training import EvalConfig

__all__ = ["HIGHER_IS_BETTER", "Best", "ModelWatch", "Stop", "diverged_line"]

HIGHER_IS_BETTER = {"auc": True, "logloss": False, "ne": False}


@dataclass(frozen=True)
class Best:
    """The run's model: checkpoint ``checkpoint``, whose holdout ``metric`` was ``value``."""

    checkpoint: str
    metric: str
    value: float
    passes_done: int

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "metric": self.metric,
            "value": self.value,
            "passes_done": self.passes_done,
        }

    def __str__(self) -> str:
        return f"{self.checkpoint} ({self.metric} {self.value:.4f})"


@dataclass(frozen=True)
class Stop:
    """Why a run stops before its schedule ends: ``early`` (patience) or ``diverged``."""

    kind: Literal["early", "diverged"]
    passes_done: int  # the pass that decided it
    why: str  # what the holdout or the loss showed
    since_best: int = 0  # evaluations without a better best_by (an early stop's count)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "passes_done": self.passes_done,
            "why": self.why,
            "since_best": self.since_best,
        }


def better(rule: EvalConfig, value: float, best: float | None) -> bool:
    """Whether ``value`` of ``rule.best_by`` beats ``best`` by more than ``min_delta``."""
    if rule.best_by is None or not math.isfinite(value):
        return False
    if best is None:
        return True
    gain = value - best if HIGHER_IS_BETTER[rule.best_by] else best - value
    return gain > rule.min_delta


class ModelWatch:
    """Follows a run's passes (:meth:`observe`) and checkpoints (:meth:`checkpointed`)."""

    def __init__(self, rule: EvalConfig) -> None:
        self.rule = rule
        self.best: Best | None = None  # the run's model so far
        self.best_value: float | None = None  # the best evaluation's, checkpointed or not
        self.since_best = 0  # evaluations since it
        self.best_logloss: float | None = None

    @classmethod
    def resumed(
        cls,
        rule: EvalConfig,
        passes: list[dict[str, Any]],
        kept: Sequence[tuple[str, int, dict[str, float]]] = (),
    ) -> ModelWatch:
        """The watch of a run continued after ``passes`` (its ``metrics.jsonl`` records),
        whose checkpoints ``kept`` (name, passes done, holdout metrics; oldest first) hold
        its best: retention never removed it."""
        watch = cls(rule)
        for rec in passes:
            watch.observe(int(rec.get("pass", 0)), rec.get("train_loss"), rec.get("eval"))
        for name, done, metrics in kept:
            watch.checkpointed(name, done, metrics)
        return watch

    def observe(
        self, passes_done: int, train_loss: float | None, metrics: dict[str, float] | None
    ) -> Stop | None:
        """A pass is done with this training loss and (when evaluated) holdout ``metrics``:
        whether the run stops here."""
        if train_loss is not None and not math.isfinite(train_loss):
            return Stop("diverged", passes_done, f"the training loss is {train_loss}")
        if not metrics:
            return None
        broken = [k for k in self.rule.measured if k in metrics and not math.isfinite(metrics[k])]
        if metrics.get("ctr") in (0.0, 1.0):
            broken = []  # one class in the holdout: AUC and NE are undefined, not diverged
        if broken:
            return Stop("diverged", passes_done, f"the holdout {broken[0]} is {metrics[broken[0]]}")
        loss = metrics.get("logloss")
        factor = self.rule.diverge_factor
        worst = None if factor is None or self.best_logloss is None else factor * self.best_logloss
        if loss is not None and worst is not None and loss > worst:
            assert self.best_logloss is not None and factor is not None
            return Stop(
                "diverged",
                passes_done,
                f"the holdout logloss {loss:.4f} is {loss / self.best_logloss:.2f}x its "
                f"best {self.best_logloss:.4f} (eval.diverge_factor {factor:g})",
            )
        if loss is not None:
            self.best_logloss = loss if self.best_logloss is None else min(self.best_logloss, loss)
        by = self.rule.best_by
        if by is None or by not in metrics:
            return None
        if better(self.rule, metrics[by], self.best_value):
            self.best_value, self.since_best = metrics[by], 0
            return None
        self.since_best += 1
        patience = self.rule.patience
        if patience is not None and self.since_best >= patience:
            assert self.best_value is not None
            return Stop(
                "early",
                passes_done,
                f"no better holdout {by} than {self.best_value:.4f} in "
                f"{self.since_best} evaluations (eval.patience {patience})",
                self.since_best,
            )
        return None

    def checkpointed(
        self, name: str, passes_done: int, metrics: dict[str, float] | None
    ) -> Best | None:
        """Checkpoint ``name`` holds the run after ``passes_done`` passes, evaluated as
        ``metrics``: the run's model now (None: the last checkpoint is)."""
        by = self.rule.best_by
        if by is None:
            return None
        value = (metrics or {}).get(by)
        if value is not None and better(
            self.rule, value, self.best.value if self.best is not None else None
        ):
            self.best = Best(name, by, float(value), passes_done)
        return self.best


def diverged_line(config: RunConfig, stop: Stop, best: Best | None) -> str:
    """The one line a diverged run ends with: where, why, what is kept, the levers and the
    command that goes on from the best checkpoint."""
    if config.several_tables:
        sparse, lower = "tables[].optimizer.lr", ""
    else:
        lr = config.table.optimizer.lr
        sparse, lower = f"table.optimizer.lr, now {lr:g}", f" --set table.optimizer.lr={lr / 2:g}"
    clip = config.dense_optimizer.grad_clip_norm
    if best is None:
        kept = "no checkpoint before it is better: start over (--overwrite) with them"
    else:
        kept = (
            f"the run's model stays {best}; go on from it: daskhps train {config.source} "
            f"--resume --checkpoint {best.checkpoint} --overwrite{lower}"
        )
    return (
        f"{config.source}: the run diverged at pass {stop.passes_done}: {stop.why}; that pass "
        f"was not checkpointed. Lower the sparse learning rate ({sparse}) or the dense one "
        f"(dense_optimizer.lr, now {config.dense_optimizer.lr:g}), or clip the dense "
        f"gradients (dense_optimizer.grad_clip_norm, now {clip or 'unset'}); {kept}"
    )

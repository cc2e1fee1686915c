"""The ``passes``, ``dense_optimizer`` and ``eval`` sections: how training is cut and stepped."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from daskhps.config._context import Ctx
from daskhps.passes.config import SHUFFLE_METHODS, PassConfig

__all__ = ["METRICS", "DenseOptimizerConfig", "EvalConfig", "PassesConfig"]

METRICS = ("auc", "logloss", "ne", "calibration")


@dataclass(frozen=True)
class PassesConfig:
    """``epochs`` over the training rows, each cut into passes by ``plan``."""

    plan: PassConfig = field(
        default_factory=lambda: PassConfig(examples_per_pass=1 << 20, global_batch_size=4096)
    )
    epochs: int = 1

    KEYS: ClassVar[tuple[str, ...]] = ("epochs", *PassConfig._KEYS)

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> PassesConfig:
        p = "passes"
        d = ctx.mapping(d, cls.KEYS, p)
        base = cls().plan
        kw = {
            "examples_per_pass": ctx.get(
                d, p, "examples_per_pass", int, base.examples_per_pass, minimum=1
            ),
            "global_batch_size": ctx.get(
                d, p, "global_batch_size", int, base.global_batch_size, minimum=1
            ),
            "max_working_set": ctx.get(d, p, "max_working_set", (int, type(None)), None, minimum=1),
            "num_shards": ctx.get(d, p, "num_shards", int, base.num_shards, minimum=1),
            "shuffle_examples": ctx.get(d, p, "shuffle_examples", bool, base.shuffle_examples),
            "shuffle_method": ctx.get(
                d, p, "shuffle_method", (str, type(None)), None, choices=SHUFFLE_METHODS
            ),
        }
        if kw["global_batch_size"] > kw["examples_per_pass"]:
            raise ctx.error(
                f"{p}.global_batch_size",
                f"{kw['global_batch_size']} must not exceed passes.examples_per_pass "
                f"({kw['examples_per_pass']})",
            )
        with ctx.section(p):
            plan = PassConfig(**kw)
        return cls(plan=plan, epochs=ctx.get(d, p, "epochs", int, 1, minimum=1))

    def to_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, **{k: getattr(self.plan, k) for k in PassConfig._KEYS}}


@dataclass(frozen=True)
class DenseOptimizerConfig:
    """The dense model's optimizer: torch ``kind`` with ``lr`` and ``weight_decay``, a learning
    rate ``schedule`` (see :meth:`lr_factor`) and optional gradient clipping by global norm."""

    kind: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    schedule: str = "constant"
    warmup_steps: int = 0
    grad_clip_norm: float | None = None

    KEYS: ClassVar[tuple[str, ...]] = (
        "kind",
        "lr",
        "weight_decay",
        "schedule",
        "warmup_steps",
        "grad_clip_norm",
    )
    KINDS: ClassVar[tuple[str, ...]] = ("sgd", "adam", "adagrad")
    SCHEDULES: ClassVar[tuple[str, ...]] = ("constant", "warmup_constant", "cosine")

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> DenseOptimizerConfig:
        p = "dense_optimizer"
        d = ctx.mapping(d, cls.KEYS, p)
        lr = ctx.get(d, p, "lr", float, 1e-3)
        if not (lr > 0 and math.isfinite(lr)):
            raise ctx.error(f"{p}.lr", f"must be a positive number, got {lr!r}")
        clip = ctx.get(d, p, "grad_clip_norm", (float, type(None)), None)
        if clip is not None and not clip > 0:
            raise ctx.error(f"{p}.grad_clip_norm", f"must be > 0 or null, got {clip!r}")
        schedule = ctx.get(d, p, "schedule", str, "constant", choices=cls.SCHEDULES)
        warmup = ctx.get(d, p, "warmup_steps", int, 0, minimum=0)
        if schedule == "constant" and warmup:
            raise ctx.error(
                f"{p}.warmup_steps", "has no effect with schedule constant; use warmup_constant"
            )
        if schedule == "warmup_constant" and not warmup:
            raise ctx.error(f"{p}.warmup_steps", "schedule warmup_constant needs warmup_steps >= 1")
        return cls(
            kind=ctx.get(d, p, "kind", str, "adam", choices=cls.KINDS),
            lr=lr,
            weight_decay=ctx.get(d, p, "weight_decay", float, 0.0, minimum=0.0),
            schedule=schedule,
            warmup_steps=warmup,
            grad_clip_norm=clip,
        )

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

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.KEYS}


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation on ``data.holdout`` after every pass (``every_pass``) and at the end, with
    read-only lookups in batches of ``batch_size``. Without a holdout nothing is evaluated."""

    every_pass: bool = True
    batch_size: int = 8192
    metrics: tuple[str, ...] = METRICS

    KEYS: ClassVar[tuple[str, ...]] = ("every_pass", "batch_size", "metrics")

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> EvalConfig:
        p = "eval"
        d = ctx.mapping(d, cls.KEYS, p)
        metrics = ctx.get(d, p, "metrics", list, list(METRICS))
        for i, m in enumerate(metrics):
            if m not in METRICS:
                raise ctx.error(
                    f"{p}.metrics[{i}]", f"{m!r} is not a metric; choose from {', '.join(METRICS)}"
                )
        if len(set(metrics)) != len(metrics):
            raise ctx.error(f"{p}.metrics", "lists a metric twice")
        return cls(
            every_pass=ctx.get(d, p, "every_pass", bool, True),
            batch_size=ctx.get(d, p, "batch_size", int, 8192, minimum=1),
            metrics=tuple(metrics),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "every_pass": self.every_pass,
            "batch_size": self.batch_size,
            "metrics": list(self.metrics),
        }

"""The ``retrain`` section: the guard a candidate must pass to be published."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from daskhps.config._context import Ctx

__all__ = ["RetrainConfig"]


@dataclass(frozen=True)
class RetrainConfig:
    """``daskhps retrain`` publishes a candidate only when, on the newest day's rows, its AUC
    is at most ``max_auc_drop`` below the published version's, its logloss at most
    ``max_logloss_rise`` above it, and its AUC at least ``min_auc`` (null: that check is off).
    Before the first publish the baseline is the untrained model."""

    max_auc_drop: float | None = 0.002
    max_logloss_rise: float | None = None
    min_auc: float | None = None

    KEYS: ClassVar[tuple[str, ...]] = ("max_auc_drop", "max_logloss_rise", "min_auc")

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> RetrainConfig:
        p = "retrain"
        d = ctx.mapping(d, cls.KEYS, p)
        num = (float, type(None))
        return cls(
            max_auc_drop=ctx.get(d, p, "max_auc_drop", num, 0.002, minimum=0.0, maximum=1.0),
            max_logloss_rise=ctx.get(d, p, "max_logloss_rise", num, None, minimum=0.0),
            min_auc=ctx.get(d, p, "min_auc", num, None, minimum=0.0, maximum=1.0),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_auc_drop": self.max_auc_drop,
            "max_logloss_rise": self.max_logloss_rise,
            "min_auc": self.min_auc,
        }

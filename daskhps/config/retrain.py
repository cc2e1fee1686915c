"""The ``retrain`` section: the guard a candidate must pass to be published, and how many
published versions stay."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from daskhps.options import Ctx, Int, Options, validate

__all__ = ["RetrainConfig"]


class RetrainConfig(Options):
    """``daskhps retrain`` publishes a candidate only when, on the newest day's rows, its AUC
    is at most ``max_auc_drop`` below the published version's, its logloss at most
    ``max_logloss_rise`` above it, and its AUC at least ``min_auc`` (null: that check is off).
    Before the first publish the baseline is the untrained model."""

    max_auc_drop: float | None = Field(0.002, ge=0.0, le=1.0)
    """`daskhps retrain` publishes only if AUC drops at most this much; null: no check."""
    max_logloss_rise: float | None = Field(None, ge=0.0)
    """... and logloss rises at most this much (null: no check)."""
    min_auc: float | None = Field(None, ge=0.0, le=1.0)
    """... and AUC is at least this (null: no check)."""
    keep_versions: Int | None = Field(None, ge=1)
    """Published versions kept after a publish (and CURRENT, and any served); null: all."""
    poll_seconds: float = Field(2.0, gt=0.0, le=3600.0)
    """`daskhps retrain --follow` lists the logs for new chunks this often."""

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> RetrainConfig:
        return validate(cls, d, ctx, "retrain")

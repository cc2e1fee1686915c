"""``generation.json``: what :func:`daskhps.data.synthetic.generate` wrote beside the logs
(config, rows, CTR, ceiling AUC overall and per day), and reading it back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from daskhps import storage
from daskhps.errors import StorageError

if TYPE_CHECKING:
    from daskhps.data.synthetic import GeneratorConfig

__all__ = ["GenerationSummary", "auc_from_histograms", "ceiling_of", "generation_record"]


def auc_from_histograms(hist: np.ndarray) -> float:
    """AUC of a score from per-label histograms ``hist[label, bin]`` over increasing scores.

    Pairs in the same bin count one half (with 65536 bins over [0, 1] this is exact to ~1e-5).
    """
    neg, pos = hist[0].astype(np.float64), hist[1].astype(np.float64)
    if neg.sum() == 0 or pos.sum() == 0:
        return float("nan")
    below = np.cumsum(neg) - neg
    return float((pos * (below + 0.5 * neg)).sum() / (pos.sum() * neg.sum()))


@dataclass(frozen=True)
class GenerationSummary:
    """What :func:`~daskhps.data.synthetic.generate` wrote (also saved as ``generation.json``
    beside the data)."""

    out: str
    config: GeneratorConfig
    rows: int
    ctr: float
    ceiling_auc: float
    days: dict[str, dict[str, float]]
    seconds: float

    @classmethod
    def of_days(
        cls, out: str, config: GeneratorConfig, days: Sequence[dict[str, Any]], seconds: float
    ) -> GenerationSummary:
        """The summary of the written ``days`` (each: its ``day``, ``rows`` and the label
        histograms ``hist`` of its click probabilities)."""
        total = sum(d["hist"] for d in days)
        rows = int(total.sum())
        return cls(
            out=str(out),
            config=config,
            rows=rows,
            ctr=float(total[1].sum() / max(rows, 1)),
            ceiling_auc=auc_from_histograms(total),
            days={
                d["day"]: {
                    "rows": int(d["rows"]),
                    "ctr": float(d["hist"][1].sum() / max(d["rows"], 1)),
                    "ceiling_auc": auc_from_histograms(d["hist"]),
                }
                for d in days
            },
            seconds=seconds,
        )

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        cfg = self.config.to_dict()
        return {
            "format": "criteo-tsv",
            "out": self.out,
            "config": cfg,
            "rows": self.rows,
            "ctr": self.ctr,
            "ceiling_auc": self.ceiling_auc,
            "days": self.days,
            "seconds": round(self.seconds, 3),
            "rows_per_second": round(self.rows_per_second, 1),
        }


def generation_record(out: str) -> Any:
    """What ``out/generation.json`` (a folder or a URL) says of the logs generated there,
    parsed; None when it is not there or does not parse. A store that cannot be reached is a
    :class:`~daskhps.errors.StorageError`."""
    path = f"{str(out).rstrip('/')}/generation.json"
    if not storage.exists(path):
        return None
    try:
        with storage.open_input(path) as f:
            return json.loads(f.read())
    except StorageError:
        raise
    except (OSError, ValueError):
        return None


def ceiling_of(out: str) -> float | None:
    """The ceiling AUC recorded in ``out/generation.json``, None when there is none to read
    (the store cannot be reached either: it only decorates a report)."""
    try:
        return float(generation_record(out)["ceiling_auc"])
    except (StorageError, KeyError, ValueError, TypeError):
        return None

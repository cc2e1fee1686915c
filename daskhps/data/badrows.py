"""Bad input rows: the policy (skip or fail) and the report of what was dropped.

Nothing bad is silent: under ``skip`` every dropped row is counted by reason and shard (input
file) and the report is logged and returned; under ``fail`` the first bad row raises a
:class:`~daskhps.errors.DataError` naming the file, the line and what was wrong.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
from pydantic import Field, field_validator, model_validator

from daskhps.options import Options

__all__ = ["REASONS", "BadRowPolicy", "BadRowReport", "Reason"]

log = logging.getLogger(__name__)


class Reason:
    """Why a row (or a whole shard) was dropped. Rows with several problems count once, under
    the first reason in this order. ``truncated_file`` counts once per file whose data ends
    early (its complete lines are kept); the last three count once per file dropped whole."""

    UNDECODABLE = "undecodable"  # a line that is not UTF-8 text
    WRONG_COLUMN_COUNT = "wrong_column_count"
    LABEL_INVALID = "label_invalid"
    DENSE_NOT_NUMERIC = "dense_not_numeric"
    TRUNCATED_FILE = "truncated_file"
    EMPTY_SHARD = "empty_shard"
    UNREADABLE_SHARD = "unreadable_shard"
    SCHEMA_MISMATCH = "schema_mismatch"


REASONS = (
    Reason.UNDECODABLE,
    Reason.WRONG_COLUMN_COUNT,
    Reason.LABEL_INVALID,
    Reason.DENSE_NOT_NUMERIC,
    Reason.TRUNCATED_FILE,
    Reason.EMPTY_SHARD,
    Reason.UNREADABLE_SHARD,
    Reason.SCHEMA_MISMATCH,
)
SHARD_REASONS = (Reason.EMPTY_SHARD, Reason.UNREADABLE_SHARD, Reason.SCHEMA_MISMATCH)


class BadRowPolicy(Options):
    """``action``: ``skip`` drops and counts bad rows; ``fail`` raises on the first one (a
    bare ``skip`` or ``fail`` is the action).

    ``max_fraction`` (skip only): raise when more than this fraction of a shard's rows is bad,
    because a file that is mostly garbage usually means a wrong schema, not noisy data.
    """

    action: Literal["skip", "fail"] = "skip"
    """Drop and count, or stop at the first."""
    max_fraction: float = Field(1.0, ge=0.0)
    """Fail when more of one file is bad (above 1: 1)."""

    @model_validator(mode="before")
    @classmethod
    def _action_alone(cls, data: Any) -> Any:
        return {"action": data} if isinstance(data, str) else data

    @field_validator("max_fraction")
    @classmethod
    def _at_most_all(cls, fraction: float) -> float:
        return min(fraction, 1.0)

    @property
    def fail(self) -> bool:
        return self.action == "fail"


@dataclass(frozen=True)
class BadRowReport:
    """Counts of dropped rows keyed by ``(shard, reason)``, plus rows read per shard.

    Whole-shard problems (empty, unreadable, schema mismatch) and a truncated file count one
    per shard.
    Reports add up with ``+`` so per-partition reports reduce to one per pass.
    """

    counts: Mapping[tuple[str, str], int] = field(default_factory=dict)
    rows: Mapping[str, int] = field(default_factory=dict)

    def __add__(self, other: BadRowReport) -> BadRowReport:
        return BadRowReport(
            dict(Counter(self.counts) + Counter(other.counts)),
            dict(Counter(self.rows) + Counter(other.rows)),
        )

    @staticmethod
    def merge(reports: Iterable[BadRowReport]) -> BadRowReport:
        counts: Counter[tuple[str, str]] = Counter()
        rows: Counter[str] = Counter()
        for r in reports:
            counts.update(r.counts)
            rows.update(r.rows)
        return BadRowReport(dict(counts), dict(rows))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def rows_read(self) -> int:
        """Good rows kept, over all shards."""
        return sum(self.rows.values())

    def by_reason(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (_, reason), n in self.counts.items():
            out[reason] += n
        return dict(sorted(out.items()))

    def by_shard(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (shard, reason), n in sorted(self.counts.items()):
            out.setdefault(shard, {})[reason] = n
        return out

    KEPT = "_kept"  # reason under which to_frame stores the rows kept per shard

    def to_frame(self) -> pd.DataFrame:
        """Long form ``shard, reason, count`` (rows kept under reason ``_kept``)."""
        recs = [(s, r, n) for (s, r), n in self.counts.items()]
        recs += [(s, self.KEPT, n) for s, n in self.rows.items()]
        return pd.DataFrame(
            {
                "shard": pd.Series([x[0] for x in recs], dtype=object),
                "reason": pd.Series([x[1] for x in recs], dtype=object),
                "count": pd.Series([x[2] for x in recs], dtype="int64"),
            }
        )

    @classmethod
    def from_frame(cls, df: Any) -> BadRowReport:
        if hasattr(df, "to_pandas"):
            df = df.to_pandas()
        counts: Counter[tuple[str, str]] = Counter()
        rows: Counter[str] = Counter()
        for shard, reason, n in zip(df["shard"], df["reason"], df["count"], strict=True):
            if reason == cls.KEPT:
                rows[str(shard)] += int(n)
            else:
                counts[(str(shard), str(reason))] += int(n)
        return cls(dict(counts), dict(rows))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: totals, per reason and per shard (for pass metrics)."""
        return {
            "rows_kept": self.rows_read,
            "bad_rows": self.total,
            "by_reason": self.by_reason(),
            "by_shard": self.by_shard(),
        }

    def log_summary(self, logger: logging.Logger = log) -> None:
        if self.total:
            parts = ", ".join(f"{r}={n}" for r, n in self.by_reason().items())
            cut = sorted(s for s, r in self.counts if r == Reason.TRUNCATED_FILE)
            named = "".join(
                f"; {s} ends early (truncated), its {self.rows.get(s, 0)} complete rows kept"
                for s in cut[:3]
            ) + (f" (and {len(cut) - 3} more truncated files)" if len(cut) > 3 else "")
            logger.warning(
                "dropped %d bad rows/shards (%s) across %d shards; kept %d rows%s",
                self.total,
                parts,
                len(self.by_shard()),
                self.rows_read,
                named,
            )

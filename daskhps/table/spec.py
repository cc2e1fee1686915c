"""What a table is: its name, row width, optimizer and initialisation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from daskhps.errors import ConfigError
from daskhps.table.optimizers import OptimizerSpec, state_width
from daskhps.table.stats import STAT_COLUMNS, STATS_WIDTH

__all__ = ["TableSpec"]


@dataclass(frozen=True)
class TableSpec:
    """One key space with one row width.

    Parameters
    ----------
    name:
        Table name; appears in every error message and in store paths.
    dim:
        Floats per key the model reads, the row's first ``dim`` columns: a config's embedding
        width plus the model's own columns (``ModelSpec.sparse_dim``: DeepFM's and Wide &
        Deep's first-order weight). The optimizer's state and the initialisation follow it.
    optimizer:
        Sparse optimizer; its kind decides how much state each row carries.
    seed:
        Initialisation seed: a row starts as a pure function of (seed, key).
    init_scale:
        Embeddings start uniform in ``[-init_scale, init_scale]``; default ``1 / sqrt(dim)``.
    """

    name: str
    dim: int
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    seed: int = 0
    init_scale: float | None = None

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ConfigError(
                f"table name {self.name!r} must be non-empty letters, digits, '-', '_' or '.'"
            )
        if not isinstance(self.dim, int) or self.dim < 1:
            raise ConfigError(
                f"table {self.name!r}: dim must be a positive integer, got {self.dim!r}"
            )
        if self.init_scale is not None and not (
            self.init_scale >= 0 and math.isfinite(self.init_scale)
        ):
            raise ConfigError(
                f"table {self.name!r}: init_scale must be a finite number >= 0, "
                f"got {self.init_scale!r}"
            )

    @property
    def width(self) -> int:
        """Floats per row: embedding, optimizer state, then the row's statistics."""
        return self.stats_at + STATS_WIDTH

    @property
    def stats_at(self) -> int:
        """The column of the row's first statistic (:mod:`daskhps.table.stats`)."""
        return self.dim + state_width(self.optimizer, self.dim)

    @property
    def row_bytes(self) -> int:
        return 4 * self.width

    @property
    def scale(self) -> float:
        return self.init_scale if self.init_scale is not None else 1.0 / math.sqrt(self.dim)

    def layout(self) -> dict[str, Any]:
        """Fields a store must agree with to be reopened by this table."""
        return {
            "table": self.name,
            "dim": self.dim,
            "width": self.width,
            "dtype": "float32",
            **self.optimizer.layout(),
            "row_stats": list(STAT_COLUMNS),
            "seed": self.seed,
            "init_scale": self.scale,
        }

"""Tier budgets of one worker: explicit rows/bytes or fractions of its memory.

On a machine without GPU the device tier and the host tier both live in the worker process,
so their fractions add up against the Dask worker's memory limit, which pauses the worker at
80% and kills it at 95%: :data:`MAX_CPU_FRACTION` keeps the tiers well below the pause line,
leaving room for batches, the dense model and Dask's own data. On a GPU the device fraction
is of the GPU's memory instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from daskhps.config.runconfig import MEMORY_BUDGET
from daskhps.errors import ConfigError
from daskhps.table import TableSpec
from daskhps.tiers.host import rows_for_bytes

__all__ = ["MAX_CPU_FRACTION", "TierSizing"]

MAX_CPU_FRACTION = MEMORY_BUDGET  # one limit for config checks and worker sizing
_MAX_GPU_FRACTION = 0.9


@dataclass(frozen=True)
class TierSizing:
    """Budgets of the device and host tiers of one worker, shared by all its tables.

    Give the device tier either ``device_fraction`` or ``device_rows`` (rows per table), and
    the host tier ``host_fraction``, ``host_bytes`` (per table) or neither (no host tier).
    A fractional budget is split between tables in proportion to the memory a row costs
    (floats, metadata and index), so every table gets about the same number of rows.
    """

    device_fraction: float | None = None
    host_fraction: float | None = None
    device_rows: int | None = None
    host_bytes: int | None = None

    def __post_init__(self) -> None:
        if (self.device_fraction is None) == (self.device_rows is None):
            raise ConfigError(
                "tier sizing: give exactly one of device_fraction and device_rows, got "
                f"device_fraction={self.device_fraction!r}, device_rows={self.device_rows!r}"
            )
        if self.host_fraction is not None and self.host_bytes is not None:
            raise ConfigError("tier sizing: give host_fraction or host_bytes, not both")
        for name in ("device_fraction", "host_fraction"):
            f = getattr(self, name)
            if f is not None and not 0.0 < f < 1.0:
                raise ConfigError(f"tier sizing: {name} must be in (0, 1), got {f!r}")
        if self.device_rows is not None and self.device_rows < 1:
            raise ConfigError(f"tier sizing: device_rows must be >= 1, got {self.device_rows}")
        if self.host_bytes is not None and self.host_bytes < 0:
            raise ConfigError(f"tier sizing: host_bytes must be >= 0, got {self.host_bytes}")

    def resolve(
        self,
        tables: Sequence[TableSpec],
        memory_limit: int | None,
        device: str = "cpu",
        policy: str = "lru",
    ) -> dict[str, tuple[int, int]]:
        """``{table: (device_rows, host_bytes)}`` for a worker with this memory limit."""
        on_gpu = torch.device(device).type == "cuda"
        cpu_share = (self.host_fraction or 0.0) + (0.0 if on_gpu else (self.device_fraction or 0.0))
        if cpu_share > MAX_CPU_FRACTION:
            raise ConfigError(
                f"tier sizing: the tiers in worker memory take {cpu_share:.2f} of the memory "
                f"limit, above {MAX_CPU_FRACTION}; Dask pauses a worker at 0.8 and kills it "
                "at 0.95: lower device_fraction/host_fraction or raise the memory limit"
            )
        needs_limit = self.host_fraction is not None or (
            self.device_fraction is not None and not on_gpu
        )
        if needs_limit and not memory_limit:
            raise ConfigError(
                "tier sizing: fractions need a worker memory limit, but the worker has none: "
                "set the cluster's memory_limit or give device_rows/host_bytes"
            )
        weights = [_row_cost(t.width, policy) for t in tables]
        total_w = sum(weights) or 1.0

        def share(budget: float, w: float) -> int:
            return int(budget * w / total_w)

        out = {}
        for t, w in zip(tables, weights, strict=True):
            if self.device_rows is not None:
                rows = self.device_rows
            else:
                frac = self.device_fraction or 0.0
                pool = (
                    torch.cuda.get_device_properties(torch.device(device)).total_memory
                    if on_gpu
                    else memory_limit or 0
                )
                rows = rows_for_bytes(t.width, share(frac * pool, w), policy)
                if rows < 1:
                    raise ConfigError(
                        f"tier sizing: table {t.name!r} gets no device rows from "
                        f"device_fraction={frac}: raise it or the memory limit"
                    )
            if self.host_bytes is not None:
                host = self.host_bytes
            elif self.host_fraction is not None:
                host = share(self.host_fraction * (memory_limit or 0), w)
            else:
                host = 0
            out[t.name] = (rows, host)
        return out


def _row_cost(width: int, policy: str) -> float:
    """Bytes a resident row costs in a tier, all overheads included (measured on 16 MiB)."""
    budget = 1 << 24
    return budget / max(rows_for_bytes(width, budget, policy), 1)

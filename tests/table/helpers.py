"""A plain-dict model of a table, and helpers shared by the table tests."""

from __future__ import annotations

import torch

from daskhps.table import TableSpec
from daskhps.table.optimizers import apply_update
from daskhps.table.read_path import initial_rows
from daskhps.table.stats import COUNT_MAX

__all__ = ["DictTable", "bits", "initial_rows"]


class DictTable:
    """What a table must behave like: a dict from key to row, rows starting at their init."""

    def __init__(self, spec: TableSpec) -> None:
        self.spec = spec
        self.rows: dict[int, torch.Tensor] = {}

    def get(self, keys: torch.Tensor) -> torch.Tensor:
        out = initial_rows(self.spec, keys)
        for i, k in enumerate(keys.tolist()):
            if k in self.rows:
                out[i] = self.rows[k]
        return out

    def apply_gradients(self, keys: torch.Tensor, grads: torch.Tensor) -> None:
        # The same arithmetic as the table (sum duplicates in one sorted block, one vectorised
        # update), so results must match bit for bit: the table adds only data movement.
        ukeys, inv = torch.unique(keys, return_inverse=True)
        summed = torch.zeros(len(ukeys), self.spec.dim).index_add_(0, inv, grads)
        block = self.get(ukeys)
        apply_update(self.spec.optimizer, block, summed, self.spec.dim)
        for i, k in enumerate(ukeys.tolist()):
            self.rows[k] = block[i].clone()

    def record_seen(
        self, keys: torch.Tensor, counts: torch.Tensor, days: torch.Tensor | int | None
    ) -> None:
        # Key by key, in Python integers: the obvious reading of "count, then last day".
        at = self.spec.stats_at
        each = days.tolist() if isinstance(days, torch.Tensor) else [days] * len(keys)
        for k, c, day in zip(keys.tolist(), counts.tolist(), each, strict=True):
            row = self.get(torch.tensor([k]))[0]
            stats = row[at : at + 2].view(torch.int32)
            stats[0] = min(int(stats[0]) + c, COUNT_MAX)
            if day is not None:
                stats[1] = max(int(stats[1]), day)
            self.rows[k] = row

    def snapshot(self) -> dict[int, torch.Tensor]:
        return {k: v.clone() for k, v in self.rows.items()}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)

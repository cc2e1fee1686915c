"""A plain-dict model of a table, and helpers shared by the table tests."""

from __future__ import annotations

import torch

from daskhps.table import TableSpec
from daskhps.table.init import init_embedding
from daskhps.table.optimizers import apply_update, init_state


def initial_rows(spec: TableSpec, keys: torch.Tensor) -> torch.Tensor:
    emb = init_embedding(keys, seed=spec.seed, dim=spec.dim, scale=spec.scale)
    return torch.cat([emb, init_state(spec.optimizer, len(keys), spec.dim, keys.device)], dim=1)


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

    def snapshot(self) -> dict[int, torch.Tensor]:
        return {k: v.clone() for k, v in self.rows.items()}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)

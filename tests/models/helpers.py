"""A tiny synthetic CTR problem with a table in the test, standing in for the sharded table."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from daskhps.models import pool, sparse_dim_of

NUM_DENSE = 3
NUM_FIELDS = 4
VOCAB = 40  # values per field
MAX_BAG = 3  # the last field is multi-hot with 0..MAX_BAG values


@dataclass
class Batch:
    dense: torch.Tensor  # float32[B, NUM_DENSE]
    keys: torch.Tensor  # int64[N] in bag order
    offsets: torch.Tensor  # int64[B * NUM_FIELDS + 1]
    labels: torch.Tensor  # float32[B]


def make_batch(n: int, gen: torch.Generator, truth: dict[str, torch.Tensor]) -> Batch:
    """``n`` examples labelled by a fixed ground truth with first- and second-order terms."""
    lengths = torch.ones(n, NUM_FIELDS, dtype=torch.int64)
    lengths[:, -1] = torch.randint(0, MAX_BAG + 1, (n,), generator=gen)
    field = torch.arange(NUM_FIELDS).expand(n, -1).repeat_interleave(lengths.flatten())
    keys = field * VOCAB + torch.randint(0, VOCAB, field.shape, generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
    dense = torch.randn(n, NUM_DENSE, generator=gen)
    a = pool(truth["a"][keys].unsqueeze(1), offsets, "mean").view(n, NUM_FIELDS)
    u = pool(truth["u"][keys], offsets, "mean").view(n, NUM_FIELDS, -1)
    logit = a.sum(1) + (u[:, 0] * u[:, 1]).sum(1) + (u[:, 2] * u[:, 3]).sum(1) + dense @ truth["w"]
    return Batch(dense, keys, offsets, (logit > 0).float())


def make_truth(gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "a": torch.randn(NUM_FIELDS * VOCAB, generator=gen),
        "u": torch.randn(NUM_FIELDS * VOCAB, 2, generator=gen),
        "w": torch.randn(NUM_DENSE, generator=gen),
    }


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve by the rank-sum (Mann-Whitney) formula; ties are negligible."""
    ranks = torch.empty_like(scores)
    ranks[scores.argsort()] = torch.arange(1, len(scores) + 1, dtype=scores.dtype)
    pos = labels.bool()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


class TableAndModel(nn.Module):
    """A dense table of ``sparse_dim`` floats per key in front of a model: lookup, pool, forward."""

    def __init__(self, model: nn.Module, embedding_dim: int) -> None:
        super().__init__()
        self.model = model
        width = sparse_dim_of(model, embedding_dim)
        self.table = nn.Parameter(0.1 * torch.randn(NUM_FIELDS * VOCAB, width))

    def forward(self, batch: Batch) -> torch.Tensor:
        rows = self.table[batch.keys]
        sparse = pool(rows, batch.offsets, "mean").view(len(batch.labels), NUM_FIELDS, -1)
        return self.model(batch.dense, sparse)

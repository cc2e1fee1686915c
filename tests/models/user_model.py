"""User models loaded by import path in the registry tests: one good, the rest each broken once."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from daskhps.models import split_fields


class TinyModel(nn.Module):
    """Follows the interface without subclassing CTRModel; reads plain ``embedding_dim`` rows."""

    def __init__(self, num_dense: int, num_fields: int, embedding_dim: int, hidden: int = 8):
        super().__init__()
        self.hidden = hidden
        self.mlp = nn.Sequential(
            nn.Linear(num_dense + num_fields * embedding_dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([dense, sparse.flatten(1)], dim=1)).squeeze(1)


class WideTiny(TinyModel):
    """Asks the table for two extra floats per key and drops them."""

    def __init__(self, *, num_dense: int, num_fields: int, embedding_dim: int) -> None:
        super().__init__(num_dense, num_fields, embedding_dim)

    @classmethod
    def sparse_dim(cls, embedding_dim: int) -> int:
        return embedding_dim + 2

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return super().forward(dense, sparse[..., :-2])


class KwargsModel(TinyModel):
    """Takes any option through ``**options``."""

    def __init__(self, **options: int) -> None:
        self.options = dict(options)
        super().__init__(options["num_dense"], options["num_fields"], options["embedding_dim"])


class NeedsWidth(TinyModel):
    def __init__(self, *, num_dense: int, num_fields: int, embedding_dim: int, width: int) -> None:
        super().__init__(num_dense, num_fields, embedding_dim, hidden=width)


class PerFieldTiny(nn.Module):
    """Takes per-field widths and a wide weight per key, like Wide & Deep; records what it got."""

    def __init__(
        self,
        *,
        num_dense: int,
        num_fields: int,
        embedding_dim: int,
        field_dims: Sequence[int] | None = None,
        hidden: int = 8,
    ) -> None:
        super().__init__()
        self.got_field_dims = field_dims
        self.field_dims = (embedding_dim,) * num_fields if field_dims is None else tuple(field_dims)
        self.mlp = nn.Sequential(
            nn.Linear(num_dense + sum(self.field_dims), hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    @classmethod
    def sparse_dim(cls, embedding_dim: int) -> int:
        return embedding_dim + 1

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        # [B, F, S].flatten(1) is the flat layout of equal widths: one code path for both.
        embeddings, weight = split_fields(sparse.flatten(1), self.field_dims, wide=True)
        assert weight is not None
        deep = self.mlp(torch.cat([dense, *embeddings], dim=1)).squeeze(1)
        return deep + weight.sum(1)


class NotAModule:
    def __init__(self, num_dense: int, num_fields: int, embedding_dim: int) -> None:
        pass


class MissingArgs(nn.Module):
    def __init__(self, num_dense: int, embedding_dim: int) -> None:
        super().__init__()


class PositionalOnly(nn.Module):
    def __init__(self, num_dense: int, num_fields: int, embedding_dim: int, /) -> None:
        super().__init__()


class FailingInit(nn.Module):
    def __init__(self, num_dense: int, num_fields: int, embedding_dim: int) -> None:
        raise RuntimeError("cannot build on purpose")


class ColumnLogits(TinyModel):
    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return super().forward(dense, sparse).unsqueeze(1)


class DoubleLogits(TinyModel):
    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return super().forward(dense, sparse).double()


class TupleLogits(TinyModel):
    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> tuple[torch.Tensor]:  # type: ignore[override]
        return (super().forward(dense, sparse),)


class FailingForward(TinyModel):
    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        raise ValueError("forward fails on purpose")


class BadSparseDim(TinyModel):
    @classmethod
    def sparse_dim(cls, embedding_dim: int) -> int:
        return 0


not_a_class = 3

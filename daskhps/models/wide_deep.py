"""Wide & Deep (Cheng et al., 2016): a linear model and an MLP, trained jointly."""

from __future__ import annotations

import torch

from daskhps.models.base import CTRModel, InputLayout
from daskhps.models.layers import (
    MLP,
    Activation,
    DenseLinear,
    Dropout,
    LayerSizes,
    check_deep_mlp,
    split_fields,
)

__all__ = ["WideDeep"]


class WideDeep(CTRModel):
    """Wide & Deep over ``D + 1`` floats per key: ``D`` embedding columns and one wide weight.

    ``logit = bias + w_dense . dense + sum_f w_f + MLP([e_1..e_F, dense])``. The wide part is
    linear in the per-key weights (one-hot features) and the dense features; it has no crossed
    features of its own: hash a cross into a field of its own to give it a weight.

    Parameters
    ----------
    layout:
        Batch layout, see :class:`~daskhps.models.base.InputLayout`.
    deep_mlp:
        Hidden widths of the deep part; a last layer to 1 logit is appended.
    activation:
        Activation after each hidden layer.
    dropout:
        Dropout after each hidden activation; 0 for none.
    """

    name = "wide_deep"

    def __init__(
        self,
        layout: InputLayout,
        *,
        deep_mlp: LayerSizes = (64, 32),
        activation: Activation = "relu",
        dropout: Dropout = 0.0,
    ) -> None:
        super().__init__(layout)
        hidden, act, p = check_deep_mlp(self.name, deep_mlp, activation, dropout)
        self.wide = DenseLinear(self.num_dense)
        self.deep = MLP(sum(self.field_dims) + self.num_dense, hidden, act, p, out_features=1)

    @classmethod
    def sparse_dim(cls, embedding_dim: int) -> int:
        return embedding_dim + 1

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        self.check_batch(dense, sparse)
        embeddings, weight = self._split(sparse)
        return self._wide_and_deep(dense, embeddings, weight)

    def _split(self, sparse: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The embeddings (``[float[B, F, D]]``, or one ``float[B, D_f]`` per field when widths
        differ) and the wide weights ``float[B, F]`` of a checked ``sparse`` input."""
        if self.equal_widths:
            return [sparse[..., :-1]], sparse[..., -1]
        embeddings, weight = split_fields(sparse, self.field_dims, wide=True)
        assert weight is not None
        return embeddings, weight

    def _wide_and_deep(
        self, dense: torch.Tensor, embeddings: list[torch.Tensor], weight: torch.Tensor
    ) -> torch.Tensor:
        """``bias + w_dense . dense + sum_f w_f + MLP([e_1..e_F, dense])`` from :meth:`_split`."""
        wide = self.wide(dense) + weight.sum(dim=1)
        deep = self.deep(torch.cat([*(e.flatten(1) for e in embeddings), dense], dim=1))
        return wide + deep.squeeze(1)

"""DeepFM (Guo et al., 2017): first-order, FM second-order and deep terms on shared embeddings."""

from __future__ import annotations

import torch

from daskhps.models.base import CTRModel
from daskhps.models.layers import (
    MLP,
    Activation,
    DenseLinear,
    Dropout,
    LayerSizes,
    check_activation,
    check_dropout,
    check_layer_sizes,
)

__all__ = ["DeepFM", "fm_interaction"]


def fm_interaction(embeddings: torch.Tensor) -> torch.Tensor:
    """FM second-order term ``sum_{i<j} <e_i, e_j>`` of ``float[B, F, D]``, as ``float[B]``.

    Uses ``((sum e)^2 - sum e^2) / 2``: O(F D) instead of O(F^2 D).
    """
    total = embeddings.sum(dim=1)
    return 0.5 * (total.square() - embeddings.square().sum(dim=1)).sum(dim=1)


class DeepFM(CTRModel):
    """DeepFM over ``D + 1`` floats per key: ``D`` embedding columns and one first-order weight.

    ``logit = bias + w_dense . dense + sum_f w_f + FM(e_1..e_F) + MLP([e_1..e_F, dense])``.
    The embeddings are shared by the FM and deep parts; the dense features enter the linear and
    deep parts.

    Parameters
    ----------
    num_dense, num_fields, embedding_dim:
        Batch layout, see :class:`~daskhps.models.base.CTRModel`.
    deep_mlp:
        Hidden widths of the deep part; a last layer to 1 logit is appended.
    activation:
        Activation after each hidden layer.
    dropout:
        Dropout after each hidden activation; 0 for none.
    """

    name = "deepfm"

    def __init__(
        self,
        *,
        num_dense: int,
        num_fields: int,
        embedding_dim: int,
        deep_mlp: LayerSizes = (64, 32),
        activation: Activation = "relu",
        dropout: Dropout = 0.0,
    ) -> None:
        super().__init__(num_dense=num_dense, num_fields=num_fields, embedding_dim=embedding_dim)
        hidden = check_layer_sizes(self.name, "deep_mlp", deep_mlp)
        act = check_activation(self.name, "activation", activation)
        p = check_dropout(self.name, "dropout", dropout)
        self.linear = DenseLinear(num_dense)
        self.deep = MLP(num_fields * embedding_dim + num_dense, hidden, act, p, out_features=1)

    @classmethod
    def sparse_dim(cls, embedding_dim: int) -> int:
        return embedding_dim + 1

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        self.check_batch(dense, sparse)
        emb, wide = sparse[..., :-1], sparse[..., -1]
        first = self.linear(dense) + wide.sum(dim=1)
        deep = self.deep(torch.cat([emb.flatten(1), dense], dim=1)).squeeze(1)
        return first + fm_interaction(emb) + deep

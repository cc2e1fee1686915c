"""DeepFM (Guo et al., 2017): first-order, FM second-order and deep terms on shared embeddings."""

from __future__ import annotations

import torch

from daskhps.models.base import InputLayout
from daskhps.models.layers import (
    Activation,
    Dropout,
    FieldProjection,
    LayerSizes,
    make_field_projection,
)
from daskhps.models.wide_deep import WideDeep

__all__ = ["DeepFM", "fm_interaction"]


def fm_interaction(embeddings: torch.Tensor) -> torch.Tensor:
    """FM second-order term ``sum_{i<j} <e_i, e_j>`` of ``float[B, F, D]``, as ``float[B]``.

    Uses ``((sum e)^2 - sum e^2) / 2``: O(F D) instead of O(F^2 D).
    """
    total = embeddings.sum(dim=1)
    return 0.5 * (total.square() - embeddings.square().sum(dim=1)).sum(dim=1)


class DeepFM(WideDeep):
    """DeepFM over ``D + 1`` floats per key: ``D`` embedding columns and one first-order weight.

    ``logit = bias + w_dense . dense + sum_f w_f + FM(e_1..e_F) + MLP([e_1..e_F, dense])``:
    Wide & Deep plus the FM second-order term over the same embeddings, so it takes the same
    options (``deep_mlp``, ``activation``, ``dropout``) and ``field_projection``.

    Fields of unequal widths (``field_dims``): the FM term pairs fields at ``D =
    embedding_dim``, the widest, each narrower field ``f`` mapped by its own
    ``Linear(D_f, D, bias=False)`` first (see :class:`~daskhps.models.layers.FieldProjection`);
    the MLP and the first-order weights read the fields as they are.

    Parameters
    ----------
    field_projection:
        Project the narrower fields when widths differ; false makes unequal widths an error.
    """

    name = "deepfm"

    def __init__(
        self,
        layout: InputLayout,
        *,
        deep_mlp: LayerSizes = (64, 32),
        activation: Activation = "relu",
        dropout: Dropout = 0.0,
        field_projection: bool = True,
    ) -> None:
        super().__init__(layout, deep_mlp=deep_mlp, activation=activation, dropout=dropout)
        # Last, so that equal widths create exactly the parameters they always did.
        self.project: FieldProjection | None = make_field_projection(
            self, "the FM second-order term", field_projection
        )

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        self.check_batch(dense, sparse)
        embeddings, weight = self._split(sparse)
        pairs = embeddings[0] if self.project is None else self.project(embeddings)
        return self._wide_and_deep(dense, embeddings, weight) + fm_interaction(pairs)

"""DeepFM (Guo et al., 2017): first-order, FM second-order and deep terms on shared embeddings."""

from __future__ import annotations

import torch

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
    options (``deep_mlp``, ``activation``, ``dropout``).
    """

    name = "deepfm"

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return super().forward(dense, sparse) + fm_interaction(sparse[..., :-1])

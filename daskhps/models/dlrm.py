"""DLRM (Naumov et al., 2019): bottom MLP, pairwise dot-product interaction, top MLP."""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from daskhps.models.base import CTRModel, InputLayout
from daskhps.models.layers import (
    MLP,
    Activation,
    Dropout,
    FieldProjection,
    LayerSizes,
    check_activation,
    check_dropout,
    check_layer_sizes,
    make_field_projection,
    split_fields,
)

__all__ = ["DLRM", "ONE_PRODUCT_FROM_WIDTH", "dot_interaction"]


# The hand-written backward saves one batched product (n * n * D multiply-adds an example)
# for a few passes over the n x n gradient, so it pays only for wide enough vectors; on one
# CPU thread a DLRM step at 26 fields took 0.72x the time at D = 64, 0.81x at 32, 0.95x at
# 24, 1.0x at 16 and 1.29x at 8 (scripts/bench_models.py).
ONE_PRODUCT_FROM_WIDTH = 24


def dot_interaction(vectors: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """Dot products of the vector pairs listed in ``pairs``.

    Parameters
    ----------
    vectors:
        ``float[B, n, D]``.
    pairs:
        ``int64[2, P]`` row and column indices into the ``n x n`` Gram matrix, e.g. the strict
        upper triangle ``torch.triu_indices(n, n, offset=1)``; no pair twice.

    Returns
    -------
    torch.Tensor
        ``float[B, P]``: ``out[b, p] = vectors[b, pairs[0, p]] . vectors[b, pairs[1, p]]``.
    """
    _, n, width = vectors.shape
    flat = pairs[0] * n + pairs[1]
    wanted = vectors.requires_grad and torch.is_grad_enabled() and not torch.jit.is_tracing()
    if wanted and width >= ONE_PRODUCT_FROM_WIDTH:
        return _PairDots.apply(vectors, flat)
    # Narrow vectors, scoring, and an export's trace (TorchScript cannot save a Python
    # autograd function): the same forward, in plain operations, under autograd.
    return _PairDots.pick(vectors, flat)


class _PairDots(torch.autograd.Function):
    """The picked entries of each example's Gram matrix ``X X^T``, with a backward of one
    batched matmul where autograd's takes two.

    One batched matmul then a gather beats P separate products; the Gram matrix is small
    (n = fields + 1, a few dozen) next to the MLPs, but its products are most of a DLRM
    step on a CPU. The gather is one index_select over the flattened matrix: a third of the
    time of indexing with the two index rows. Autograd would differentiate ``bmm(X, X^T)`` as
    two products, ``G X`` and ``G^T X``; both operands are the same ``X``, so
    ``(G + G^T) X`` is the same gradient in one (the diagonal, if picked, counts twice, as
    ``d(x.x)/dx = 2x`` wants).
    """

    @staticmethod
    def pick(vectors: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        """The forward: the entries ``flat`` (row * n + column) of each Gram matrix."""
        b, n, _ = vectors.shape
        gram = torch.bmm(vectors, vectors.transpose(1, 2))
        return gram.reshape(b, n * n).index_select(1, flat)

    @staticmethod
    def forward(ctx: Any, vectors: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(vectors, flat)
        return _PairDots.pick(vectors, flat)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        vectors, flat = ctx.saved_tensors
        b, n, _ = vectors.shape
        # Each picked entry once (the pairs are distinct), so a copy, not an accumulation.
        picked = grad.new_zeros(b, n * n).index_copy_(1, flat, grad).view(b, n, n)
        return torch.bmm(picked + picked.transpose(1, 2), vectors), None


class DLRM(CTRModel):
    """Deep Learning Recommendation Model with dot interactions.

    The bottom MLP maps the dense features to one ``D``-wide vector ``x`` (ReLU-style activation
    on its output too, as in the reference). ``x`` and the ``F`` field embeddings interact by
    pairwise dot products, strict upper triangle (no self terms): ``(F + 1) F / 2`` values. The
    top MLP reads ``[x, interactions]`` and returns one logit. With ``num_dense == 0`` there is no
    bottom MLP and only the field embeddings interact.

    Fields of unequal widths (``field_dims``) meet at ``D = embedding_dim``, the widest: each
    narrower field ``f`` is mapped by its own ``Linear(D_f, D, bias=False)`` first (see
    :class:`~daskhps.models.layers.FieldProjection`).

    Parameters
    ----------
    layout:
        Batch layout, see :class:`~daskhps.models.base.InputLayout`.
    bottom_mlp:
        Hidden widths of the bottom MLP; a last layer to ``embedding_dim`` is appended.
    top_mlp:
        Hidden widths of the top MLP; a last layer to 1 logit is appended.
    activation:
        Activation after each hidden layer.
    dropout:
        Dropout after each hidden activation of the top MLP; 0 for none.
    field_projection:
        Project the narrower fields when widths differ; false makes unequal widths an error.
    """

    name = "dlrm"
    pairs: torch.Tensor  # int64[2, P] strict upper triangle of the Gram matrix (a buffer)

    def __init__(
        self,
        layout: InputLayout,
        *,
        bottom_mlp: LayerSizes = (64,),
        top_mlp: LayerSizes = (64, 32),
        activation: Activation = "relu",
        dropout: Dropout = 0.0,
        field_projection: bool = True,
    ) -> None:
        super().__init__(layout)
        bottom = check_layer_sizes(self.name, "bottom_mlp", bottom_mlp)
        top = check_layer_sizes(self.name, "top_mlp", top_mlp)
        act = check_activation(self.name, "activation", activation)
        p = check_dropout(self.name, "dropout", dropout)
        self.bottom: MLP | None = None
        n = self.num_fields
        if self.num_dense > 0:
            self.bottom = MLP(
                self.num_dense, bottom, act, out_features=self.embedding_dim, out_activation=True
            )
            n += 1
        # A buffer moves with .to(device); not persistent, so state_dict holds only weights.
        self.register_buffer("pairs", torch.triu_indices(n, n, offset=1), persistent=False)
        top_in = n * (n - 1) // 2 + (self.embedding_dim if self.bottom is not None else 0)
        self.top = MLP(top_in, top, act, dropout=p, out_features=1)
        # Last, so that equal widths create exactly the parameters they always did.
        self.project: FieldProjection | None = make_field_projection(
            self, "the pairwise interaction", field_projection
        )

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        self.check_batch(dense, sparse)
        if self.project is not None:  # flat input: every field to [B, D], then [B, F, D]
            sparse = self.project(split_fields(sparse, self.field_dims)[0])
        if self.bottom is None:
            return self.top(dot_interaction(sparse, self.pairs)).squeeze(1)
        x = self.bottom(dense)
        vectors = torch.cat([x.unsqueeze(1), sparse], dim=1)
        return self.top(torch.cat([x, dot_interaction(vectors, self.pairs)], dim=1)).squeeze(1)

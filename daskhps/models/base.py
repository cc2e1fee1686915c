"""The interface every dense model follows, built-in or a user's own.

A model sees one mini-batch as two dense tensors; the embedding rows were looked up in the
sharded table (and multi-hot bags pooled by :func:`daskhps.models.pool`) before it::

    B examples, num_dense dense features, F fields, D = embedding_dim, S = sparse_dim(D)

    dense: float32[B, num_dense]          sparse: float32[B, F, S]
                                                    field 0              field F-1
    ex 0   x[0,0] x[0,1] ... x[0,nd-1]      ex 0   [e e ... e | w] ... [e e ... e | w]
    ex 1   x[1,0] x[1,1] ... x[1,nd-1]      ex 1   [e e ... e | w] ... [e e ... e | w]
    ...                                     ...     <--- D --->  ^
                                                                 extra column(s) when S > D

    forward(dense, sparse) -> logits: float32[B]   (before the sigmoid; BCE-with-logits loss)

``S = model.sparse_dim(D)`` where ``D`` is the embedding dim: DLRM and DCN-v2 read plain
``D``-wide embeddings; DeepFM and Wide & Deep read ``D + 1`` floats per key and use the last
one as the key's first-order ("wide") weight, so the table stores one more column and no second
table is needed. The gradient of ``sparse`` is what flows back to the table's rows.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from daskhps.errors import ConfigError, DataError

__all__ = ["CTRModel"]


class CTRModel(nn.Module):
    """Base class of the built-in models; a user's model may follow the same interface without it.

    Subclasses are built as ``Cls(num_dense=..., num_fields=..., embedding_dim=..., **options)``
    where the options are the remaining keyword-only constructor arguments, each with a default
    and a type annotation (both are read to validate a config). ``forward(dense, sparse)``
    returns ``float32[B]`` logits, with the input layout pictured in this module's docstring.
    Parameters are initialised from torch's global generator only, so ``torch.manual_seed``
    fixes them, and every worker of a data-parallel run starts from the same model.

    Parameters
    ----------
    num_dense:
        Dense features per example (may be 0).
    num_fields:
        Sparse fields per example (at least 1).
    embedding_dim:
        Embedding width ``D`` of every field.
    """

    #: Name used in error messages and by :func:`daskhps.models.build_model`.
    name: ClassVar[str] = "model"

    def __init__(self, *, num_dense: int, num_fields: int, embedding_dim: int) -> None:
        super().__init__()
        for arg, value, least in (
            ("num_dense", num_dense, 0),
            ("num_fields", num_fields, 1),
            ("embedding_dim", embedding_dim, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(
                    f"model {self.name!r}: {arg} must be an integer >= {least}, got {value!r}"
                )
        self.num_dense = num_dense
        self.num_fields = num_fields
        self.embedding_dim = embedding_dim

    @classmethod
    def sparse_dim(cls, embedding_dim: int) -> int:
        """Floats per key the model reads from the table for an embedding of ``embedding_dim``."""
        return embedding_dim

    def check_batch(self, dense: torch.Tensor, sparse: torch.Tensor) -> None:
        """Raise :class:`DataError` unless ``dense`` and ``sparse`` match this model's layout."""
        b = dense.shape[0] if dense.dim() == 2 else -1
        want_sparse = (b, self.num_fields, self.sparse_dim(self.embedding_dim))
        ok_dense = dense.dim() == 2 and dense.shape[1] == self.num_dense
        if not ok_dense or tuple(sparse.shape) != want_sparse:
            raise DataError(
                f"model {self.name!r}: expected dense [B, {self.num_dense}] and sparse "
                f"[B, {self.num_fields}, {want_sparse[2]}], got dense {list(dense.shape)} and "
                f"sparse {list(sparse.shape)}"
            )

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

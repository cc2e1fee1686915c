"""The interface every dense model follows, built-in or a user's own.

A model sees one mini-batch as two dense tensors; the embedding rows were looked up in the
sharded tables (and multi-hot bags pooled by :func:`daskhps.models.pool`) before it. Each field
``f`` has an embedding width ``D_f`` (its table's dim). When every field has the same width
``D = embedding_dim`` the sparse input is three-dimensional, one row per field::

    B examples, num_dense dense features, F fields, D = embedding_dim, S = sparse_dim(D)

    dense: float32[B, num_dense]          sparse: float32[B, F, S]
                                                    field 0              field F-1
    ex 0   x[0,0] x[0,1] ... x[0,nd-1]      ex 0   [e e ... e | w] ... [e e ... e | w]
    ex 1   x[1,0] x[1,1] ... x[1,nd-1]      ex 1   [e e ... e | w] ... [e e ... e | w]
    ...                                     ...     <--- D --->  ^
                                                                 extra column(s) when S > D

When the widths differ (``field_dims``; ``embedding_dim`` is then their maximum) the fields'
rows sit side by side in one flat row per example, in field order, each laid out as above::

    S_f = sparse_dim(D_f)                 sparse: float32[B, S_0 + S_1 + ... + S_{F-1}]
                                                    field 0          field 1            ...
                                            ex 0   [e ... e | w]    [e e e ... e | w]  ...
                                                    <- D_0 ->        <--- D_1 --->

    forward(dense, sparse) -> logits: float32[B]   (before the sigmoid; BCE-with-logits loss)

``S = model.sparse_dim(D)`` where ``D`` is the embedding dim: DLRM and DCN-v2 read plain
``D``-wide embeddings; DeepFM and Wide & Deep read ``D + 1`` floats per key and use the last
one as the key's first-order ("wide") weight, so the table stores one more column and no second
table is needed. The gradient of ``sparse`` is what flows back to the tables' rows.
:func:`daskhps.models.layers.split_fields` cuts a flat input into its fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from daskhps.errors import ConfigError, DataError

if TYPE_CHECKING:  # typing.Self is Python 3.11's
    from typing import Self

__all__ = [
    "CTRModel",
    "InputLayout",
    "UnequalWidthsError",
    "check_field_dims",
    "describe_widths",
    "list_widths",
]


def list_widths(field_dims: Sequence[int]) -> str:
    """``"widths 8 and 32"``: the distinct widths, smallest first."""
    widths = sorted(set(field_dims))
    listed = ", ".join(map(str, widths[:-1])) + " and " if len(widths) > 1 else ""
    return f"width{'s' if len(widths) > 1 else ''} {listed}{widths[-1]}"


def describe_widths(field_dims: Sequence[int], limit: int = 5) -> str:
    """``"widths 8 and 32 (8: fields 1, 4; 32: fields 0, 2, 3, ...)"``: which field has which."""
    widths = sorted(set(field_dims))
    groups = []
    for w in widths:
        idx = [f for f, d in enumerate(field_dims) if d == w]
        shown = ", ".join(map(str, idx[:limit])) + (", ..." if len(idx) > limit else "")
        groups.append(f"{w}: field{'s' if len(idx) > 1 else ''} {shown}")
    return f"{list_widths(field_dims)} ({'; '.join(groups)})"


class UnequalWidthsError(ConfigError):
    """A model that reads one width for every field was given unequal ones.

    ``key`` is the config key whose change fixes it (relative to ``model``); a caller that
    knows which table gives each field its width rewords the widths with :meth:`saying`.
    """

    def __init__(self, lead: str, field_dims: Sequence[int], fix: str, key: str) -> None:
        self.lead, self.field_dims, self.fix, self.key = lead, tuple(field_dims), fix, key
        super().__init__(self.saying(describe_widths(field_dims)))

    def saying(self, widths: str) -> str:
        """The message with ``widths`` for the per-field description of the widths."""
        return f"{self.lead} the tables give the fields {widths}; {self.fix}"


def check_field_dims(
    model: str, num_fields: int, embedding_dim: int, field_dims: Sequence[int] | None
) -> tuple[int, ...]:
    """Per-field widths as a tuple (every field ``embedding_dim`` wide for ``None``).

    Raises
    ------
    ConfigError
        ``field_dims`` is not a sequence of ``num_fields`` integers ``>= 1``, or its maximum is
        not ``embedding_dim`` (the width of DLRM's interaction and the widest table's dim).
    """
    if field_dims is None:
        return (embedding_dim,) * num_fields
    if isinstance(field_dims, (str, bytes)) or not isinstance(field_dims, Sequence):
        raise ConfigError(
            f"model {model!r}: field_dims must be a list of per-field embedding widths, "
            f"got {field_dims!r}"
        )
    dims = tuple(field_dims)
    bad = [d for d in dims if isinstance(d, bool) or not isinstance(d, int) or d < 1]
    if bad or len(dims) != num_fields:
        raise ConfigError(
            f"model {model!r}: field_dims must hold {num_fields} integers >= 1 (one per field), "
            f"got {list(dims)!r}"
        )
    if max(dims) != embedding_dim:
        raise ConfigError(
            f"model {model!r}: embedding_dim must be the largest of field_dims, "
            f"{max(dims)}, got {embedding_dim}"
        )
    return dims


@dataclass(frozen=True)
class InputLayout:
    """What a batch holds, as every model is built for it (pictured in this module's docstring).

    Parameters
    ----------
    num_dense:
        Dense features per example (may be 0).
    num_fields:
        Sparse fields per example (at least 1).
    embedding_dim:
        Embedding width ``D`` of every field, or the largest of ``field_dims``.
    field_dims:
        Embedding width ``D_f`` of each field, in field order; ``None``: every field is
        ``embedding_dim`` wide. Equal widths are the same as ``None`` (the same parameters,
        input layout and outputs); unequal ones make ``sparse`` one flat row per example.
    """

    num_dense: int
    num_fields: int
    embedding_dim: int
    field_dims: Sequence[int] | None = None

    @classmethod
    def of_fields(cls, num_dense: int, field_dims: Sequence[int]) -> InputLayout:
        """The layout of fields ``field_dims`` wide: ``embedding_dim`` is the widest of them."""
        return cls(num_dense, len(field_dims), max(field_dims), tuple(field_dims))

    def checked(self, model: str) -> InputLayout:
        """This layout with ``field_dims`` a tuple, always filled.

        Raises
        ------
        ConfigError
            Naming ``model``: a count that is not an integer (``num_dense >= 0``, the others
            ``>= 1``), or ``field_dims`` that :func:`check_field_dims` refuses.
        """
        for arg, least in (("num_dense", 0), ("num_fields", 1), ("embedding_dim", 1)):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(
                    f"model {model!r}: {arg} must be an integer >= {least}, got {value!r}"
                )
        dims = check_field_dims(model, self.num_fields, self.embedding_dim, self.field_dims)
        return replace(self, field_dims=dims)

    def keywords(self) -> dict[str, Any]:
        """The constructor arguments of a model that follows the interface without subclassing
        :class:`CTRModel`; ``field_dims`` only when the widths differ."""
        out: dict[str, Any] = {
            "num_dense": self.num_dense,
            "num_fields": self.num_fields,
            "embedding_dim": self.embedding_dim,
        }
        if self.field_dims is not None and len(set(self.field_dims)) > 1:
            out["field_dims"] = tuple(self.field_dims)
        return out


class CTRModel(nn.Module):
    """Base class of the built-in models; a user's model may follow the same interface without it.

    A built-in model is built as ``Cls(layout, **options)`` from an :class:`InputLayout` (or
    ``Cls.build(num_dense=..., num_fields=..., embedding_dim=..., **options)``), where the
    options are the remaining keyword-only constructor arguments, each with a default and a
    type annotation (both are read to validate a config). ``forward(dense, sparse)`` returns
    ``float32[B]`` logits, with the input layout pictured in this module's docstring.
    Parameters are initialised from torch's global generator only, so ``torch.manual_seed``
    fixes them, and every worker of a data-parallel run starts from the same model.
    """

    #: Name used in error messages and by :func:`daskhps.models.build_model`.
    name: ClassVar[str] = "model"

    def __init__(self, layout: InputLayout) -> None:
        super().__init__()
        layout = layout.checked(self.name)
        self.num_dense = layout.num_dense
        self.num_fields = layout.num_fields
        self.embedding_dim = layout.embedding_dim
        #: ``D_f`` of every field, always filled.
        self.field_dims: tuple[int, ...] = tuple(layout.field_dims or ())
        #: Whether ``sparse`` is ``[B, F, S]`` (True) or the flat ``[B, sum_f S_f]``.
        self.equal_widths = len(set(self.field_dims)) == 1
        #: ``S_f = sparse_dim(D_f)`` of every field: the widths of the fields' slices.
        self.sparse_widths = tuple(self.sparse_dim(d) for d in self.field_dims)

    @classmethod
    def build(
        cls,
        *,
        num_dense: int,
        num_fields: int,
        embedding_dim: int,
        field_dims: Sequence[int] | None = None,
        **options: Any,
    ) -> Self:
        """``cls(InputLayout(num_dense, num_fields, embedding_dim, field_dims), **options)``."""
        return cls(InputLayout(num_dense, num_fields, embedding_dim, field_dims), **options)

    @classmethod
    def sparse_dim(cls, embedding_dim: int) -> int:
        """Floats per key the model reads from the table for an embedding of ``embedding_dim``."""
        return embedding_dim

    def check_batch(self, dense: torch.Tensor, sparse: torch.Tensor) -> None:
        """Raise :class:`DataError` unless ``dense`` and ``sparse`` match this model's layout."""
        b = dense.shape[0] if dense.dim() == 2 else -1
        if self.equal_widths:
            want_sparse: tuple[int, ...] = (b, self.num_fields, self.sparse_widths[0])
            layout = ""
        else:
            want_sparse = (b, sum(self.sparse_widths))
            layout = f" (fields of {', '.join(map(str, self.sparse_widths))} floats)"
        ok_dense = dense.dim() == 2 and dense.shape[1] == self.num_dense
        if not ok_dense or tuple(sparse.shape) != want_sparse:
            raise DataError(
                f"model {self.name!r}: expected dense [B, {self.num_dense}] and sparse "
                f"[B, {', '.join(map(str, want_sparse[1:]))}]{layout}, got dense "
                f"{list(dense.shape)} and sparse {list(sparse.shape)}"
            )

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

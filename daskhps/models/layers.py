"""Building blocks shared by the built-in models, and the checks of their options."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import nn

from daskhps.errors import ConfigError
from daskhps.models.base import CTRModel, UnequalWidthsError

__all__ = [
    "ACTIVATIONS",
    "MLP",
    "Activation",
    "DenseLinear",
    "Dropout",
    "FieldProjection",
    "LayerSizes",
    "OptionCheck",
    "check_activation",
    "check_deep_mlp",
    "check_dropout",
    "check_layer_sizes",
    "make_field_projection",
    "split_fields",
]


@dataclass(frozen=True)
class OptionCheck:
    """Annotation metadata: ``check(model, option, value)`` raises ConfigError if ``value`` is bad.

    Config validation reads it from ``Annotated`` constructor hints, so an option's range check
    is written once and runs both when a config is loaded and when the model is built.
    """

    check: Callable[[str, str, Any], object]


ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
}


def check_layer_sizes(model: str, option: str, sizes: Sequence[int]) -> tuple[int, ...]:
    """Return ``sizes`` as a tuple of positive ints, or raise :class:`ConfigError`."""
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise ConfigError(
            f"model {model!r}: option {option!r} must be a list of layer widths, got {sizes!r}"
        )
    bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s < 1]
    if bad:
        raise ConfigError(
            f"model {model!r}: option {option!r} must hold positive integers, got {list(sizes)!r}"
        )
    return tuple(sizes)


def check_dropout(model: str, option: str, dropout: float) -> float:
    """Return ``dropout`` as a float in ``[0, 1)``, or raise :class:`ConfigError`."""
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ConfigError(
            f"model {model!r}: option {option!r} must be a number in [0, 1), got {dropout!r}"
        )
    return float(dropout)


def check_activation(model: str, option: str, activation: str) -> type[nn.Module]:
    """Return the activation class called ``activation``, or raise :class:`ConfigError`."""
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ConfigError(
            f"model {model!r}: option {option!r} must be one of {sorted(ACTIVATIONS)}, "
            f"got {activation!r}"
        )
    return ACTIVATIONS[activation]


def check_deep_mlp(
    model: str, deep_mlp: Sequence[int], activation: str, dropout: float
) -> tuple[tuple[int, ...], type[nn.Module], float]:
    """The options of a model's deep MLP (``deep_mlp``, ``activation``, ``dropout``), checked."""
    return (
        check_layer_sizes(model, "deep_mlp", deep_mlp),
        check_activation(model, "activation", activation),
        check_dropout(model, "dropout", dropout),
    )


# Option types of the built-in models: the annotation carries the check (see OptionCheck).
LayerSizes = Annotated[Sequence[int], OptionCheck(check_layer_sizes)]
Dropout = Annotated[float, OptionCheck(check_dropout)]
Activation = Annotated[
    Literal["relu", "gelu", "silu", "tanh", "sigmoid"], OptionCheck(check_activation)
]


class MLP(nn.Sequential):
    """``Linear -> activation [-> Dropout]`` per hidden width, then an optional output layer.

    Parameters
    ----------
    in_features:
        Input width.
    hidden:
        Hidden layer widths, in order; may be empty.
    activation:
        Activation class applied after every hidden layer.
    dropout:
        Dropout probability after every hidden activation; 0 adds no Dropout module.
    out_features:
        Width of a final linear layer; ``None`` for none.
    out_activation:
        Apply ``activation`` after the final layer too (DLRM's bottom MLP does).
    """

    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int],
        activation: type[nn.Module],
        dropout: float = 0.0,
        out_features: int | None = None,
        out_activation: bool = False,
    ) -> None:
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), activation()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = h
        if out_features is not None:
            layers.append(nn.Linear(width, out_features))
            if out_activation:
                layers.append(activation())
            width = out_features
        super().__init__(*layers)
        self.out_features = width


class DenseLinear(nn.Module):
    """``bias + w . dense`` as ``float[B]``: the dense half of a wide (linear) term.

    The bias starts at 0 and exists even with no dense features, so the wide term always has one.
    """

    def __init__(self, num_dense: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1))
        # nn.Linear(0, 1) warns and has nothing to learn; keep no weight at all instead.
        self.weight = nn.Linear(num_dense, 1, bias=False) if num_dense > 0 else None

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        out = self.bias.expand(dense.shape[0])
        if self.weight is not None:
            out = out + self.weight(dense).squeeze(1)
        return out


def split_fields(
    sparse: torch.Tensor, field_dims: Sequence[int], wide: bool = False
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Cut the flat sparse input of fields with unequal widths into its fields.

    Parameters
    ----------
    sparse:
        ``float[B, sum_f S_f]``, fields in order (see :mod:`daskhps.models.base`).
    field_dims:
        Embedding width ``D_f`` of each field.
    wide:
        Whether each field's slice ends in a wide weight (``S_f = D_f + 1``, DeepFM and
        Wide & Deep) or is the embedding alone (``S_f = D_f``).

    Returns
    -------
    tuple
        The fields' embeddings ``[float[B, D_0], ..., float[B, D_{F-1}]]`` (views of
        ``sparse``) and, with ``wide``, their wide weights ``float[B, F]`` (else None).
    """
    extra = 1 if wide else 0
    # One split into views; the loop is over fields, never over examples.
    parts = torch.split(sparse, [d + extra for d in field_dims], dim=1)
    if not wide:
        return list(parts), None
    return [p[:, :-1] for p in parts], torch.stack([p[:, -1] for p in parts], dim=1)


class FieldProjection(nn.Module):
    """Every field's embedding at one ``width``: ``float[B, D_f]`` each to ``float[B, F, width]``.

    A field already ``width`` wide passes unchanged; field ``f`` of another width gets its own
    ``Linear(D_f, width, bias=False)`` (``by_field[str(f)]``), learned with the model. Pairwise
    interactions (DLRM's dot products, DeepFM's FM term) need one width for all fields.

    Parameters
    ----------
    field_dims:
        Embedding width ``D_f`` of each field.
    width:
        The common width; the layers are created in field order from torch's global generator.
    """

    def __init__(self, field_dims: Sequence[int], width: int) -> None:
        super().__init__()
        other = [(str(f), d) for f, d in enumerate(field_dims) if d != width]
        self.by_field = nn.ModuleDict({f: nn.Linear(d, width, bias=False) for f, d in other})
        by_width: dict[int, list[int]] = {}
        for f, d in enumerate(field_dims):
            if d != width:
                by_width.setdefault(d, []).append(f)
        self._by_width = list(by_width.values())  # the narrower fields, grouped by width

    def forward(self, embeddings: Sequence[torch.Tensor]) -> torch.Tensor:
        # The fields of one width in one batched product: their inner dimensions are small
        # (4 to 32), where a product runs far below a CPU's peak, and one product of k
        # matrices took 0.75x the time of k separate ones (forward and backward, 21 fields
        # at batch 4,096). The weights stay one Linear a field, so checkpoints load as before.
        projected = list(embeddings)
        for fields in self._by_width:
            x = torch.stack([embeddings[f] for f in fields])  # [k, B, D_f]
            w = torch.stack([self._weight(f) for f in fields])  # [k, width, D_f]
            for f, y in zip(fields, torch.bmm(x, w.transpose(1, 2)), strict=True):
                projected[f] = y
        return torch.stack(projected, dim=1)

    def _weight(self, field: int) -> torch.Tensor:
        layer = self.by_field[str(field)]
        assert isinstance(layer, nn.Linear)
        return layer.weight


def make_field_projection(
    model: CTRModel, interaction: str, enabled: bool
) -> FieldProjection | None:
    """The projection ``model``'s pairwise ``interaction`` needs: None when every field is
    ``model.embedding_dim`` wide.

    Raises
    ------
    ConfigError
        The widths differ and the model's ``field_projection`` option is false.
    """
    field_dims, width = model.field_dims, model.embedding_dim
    if all(d == width for d in field_dims):
        return None
    if not enabled:
        raise UnequalWidthsError(
            f"model {model.name!r}: {interaction} needs one width for every field, but",
            field_dims,
            "set model.options.field_projection to true (a learned linear map of each narrower "
            f"field to {width}), or give every table the same dim",
            key="options.field_projection",
        )
    return FieldProjection(field_dims, width)

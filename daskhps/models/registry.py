"""Pick a model by built-in name or import path, build it, and probe a user's model once."""

from __future__ import annotations

import importlib
import types
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from daskhps.errors import ConfigError
from daskhps.models.base import InputLayout, UnequalWidthsError
from daskhps.models.dcn import DCNv2
from daskhps.models.deepfm import DeepFM
from daskhps.models.dlrm import DLRM
from daskhps.models.options import (
    LAYOUT_ARGS,
    WIDTHS_ARG,
    OptionError,
    check_options,
    constructor_params,
    takes_keyword,
)
from daskhps.models.wide_deep import WideDeep

__all__ = [
    "BUILTIN_MODELS",
    "build_for",
    "build_model",
    "resolve_model",
    "sparse_dim_of",
]

BUILTIN_MODELS: Mapping[str, type[nn.Module]] = types.MappingProxyType(
    {"dlrm": DLRM, "deepfm": DeepFM, "wide_deep": WideDeep, "dcnv2": DCNv2}
)

_PROBE_BATCH = 2


def resolve_model(name: str) -> type[nn.Module]:
    """The model class for a built-in ``name`` or a ``"package.module:ClassName"`` import path.

    Raises
    ------
    ConfigError
        Unknown built-in name, the path does not import, the object is not an ``nn.Module``
        subclass, or its constructor does not take ``num_dense``, ``num_fields`` and
        ``embedding_dim`` as keyword arguments.
    """
    if not isinstance(name, str):
        raise ConfigError(f"model name must be a string, got {name!r}")
    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name]
    if ":" not in name:
        raise ConfigError(
            f"unknown model {name!r}: use one of {sorted(BUILTIN_MODELS)} or the import path "
            "'package.module:ClassName' of your own nn.Module"
        )
    module_name, _, attr = name.partition(":")
    if not module_name or not attr or ":" in attr:
        raise ConfigError(f"model {name!r}: an import path must look like 'package.module:Class'")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # a user module may fail in any way while importing
        raise ConfigError(
            f"model {name!r}: module {module_name!r} failed to import "
            f"({type(e).__name__}: {e}); is its package installed or on PYTHONPATH?"
        ) from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"model {name!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, nn.Module)):
        raise ConfigError(f"model {name!r}: {obj!r} is not a torch.nn.Module subclass")
    params = constructor_params(obj)
    missing = [a for a in LAYOUT_ARGS if not takes_keyword(params, a)]
    if missing:
        raise ConfigError(
            f"model {name!r}: the constructor must take keyword arguments {list(LAYOUT_ARGS)}; "
            f"it lacks {missing} (models are built as Cls(num_dense=..., num_fields=..., "
            "embedding_dim=..., **options))"
        )
    return obj


def sparse_dim_of(model: nn.Module | type[nn.Module], embedding_dim: int) -> int:
    """Floats per key ``model`` (an instance or a class) reads from the table.

    ``model.sparse_dim(embedding_dim)`` where the model defines it, else ``embedding_dim``.
    """
    fn = getattr(model, "sparse_dim", None)
    if fn is None:
        return embedding_dim
    width = fn(embedding_dim) if callable(fn) else fn
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ConfigError(
            f"model {getattr(model, '__name__', type(model).__name__)}: sparse_dim({embedding_dim})"
            f" must return a positive int, got {width!r}"
        )
    return width


def build_model(
    name: str,
    *,
    num_dense: int,
    num_fields: int,
    embedding_dim: int,
    field_dims: Sequence[int] | None = None,
    **options: Any,
) -> nn.Module:
    """Build a dense CTR model.

    Parameters
    ----------
    name:
        ``"dlrm"``, ``"deepfm"``, ``"wide_deep"``, ``"dcnv2"``, or ``"package.module:ClassName"``
        of a user's ``nn.Module`` that follows :class:`~daskhps.models.base.CTRModel`'s
        interface.
    num_dense, num_fields, embedding_dim:
        Batch layout; the sparse input is ``[B, num_fields, sparse_dim_of(model, embedding_dim)]``.
    field_dims:
        Each field's embedding width, ``embedding_dim`` being the largest; ``None`` or equal
        widths: every field is ``embedding_dim`` wide. Passed on to the model only when the
        widths differ (its ``sparse`` input is then ``[B, sum_f sparse_dim_of(model, D_f)]``),
        so a model without a ``field_dims`` parameter builds as before for equal widths.
    **options:
        The model's own constructor options (layer sizes, activation, dropout, ...).

    Raises
    ------
    ConfigError
        Unknown model or option, a bad option value, bad ``field_dims``, unequal widths for a
        model that takes no ``field_dims``, or a user model that breaks the interface: it is
        checked on a tiny probe batch and must return ``float32[B]`` logits.
    """
    layout = InputLayout(num_dense, num_fields, embedding_dim, field_dims)
    return build_for(name, layout, options)


def build_for(name: str, layout: InputLayout, options: Mapping[str, Any]) -> nn.Module:
    """:func:`build_model` of ``layout``: a built-in model gets it whole, a user's model its
    :meth:`~InputLayout.keywords`."""
    cls = resolve_model(name)
    try:
        check_options(cls, name, options)
    except OptionError as e:
        raise ConfigError(e.message) from None
    layout = layout.checked(name)
    if cls in BUILTIN_MODELS.values():
        return cls(layout, **options)
    keywords = layout.keywords()
    if WIDTHS_ARG in keywords and not takes_keyword(constructor_params(cls), WIDTHS_ARG):
        raise UnequalWidthsError(
            f"model {name!r} takes one embedding_dim for every field, but",
            keywords[WIDTHS_ARG],
            f"give every table the same dim, or add a {WIDTHS_ARG} parameter to the model",
            key="name",
        )
    try:
        model = cls(**keywords, **options)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(
            f"model {name!r}: the constructor failed with {type(e).__name__}: {e}"
        ) from e
    _probe(model, name, layout)
    return model


def _probe(model: nn.Module, name: str, layout: InputLayout) -> None:
    """Run a user model once on a tiny batch and check the logits' shape and dtype."""
    dims = layout.field_dims or ()
    if len(set(dims)) == 1:
        sparse_shape = [layout.num_fields, sparse_dim_of(model, layout.embedding_dim)]
    else:
        sparse_shape = [sum(sparse_dim_of(model, d) for d in dims)]
    # A private generator: probing must not move torch's global RNG, which seeds the run.
    gen = torch.Generator().manual_seed(0)
    dense = torch.randn(_PROBE_BATCH, layout.num_dense, generator=gen)
    sparse = torch.randn(_PROBE_BATCH, *sparse_shape, generator=gen)
    where = (
        f"model {name!r}: forward(dense {list(dense.shape)}, sparse {list(sparse.shape)}) on a "
        "probe batch"
    )
    was_training = model.training
    model.eval()  # no dropout, no batch-norm statistics updated by the probe
    try:
        with torch.no_grad():
            out = model(dense, sparse)
    except Exception as e:
        raise ConfigError(f"{where} failed with {type(e).__name__}: {e}") from e
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor):
        raise ConfigError(f"{where} returned {type(out).__name__}, expected a tensor of logits")
    if tuple(out.shape) != (_PROBE_BATCH,):
        hint = " (squeeze the last dimension)" if tuple(out.shape) == (_PROBE_BATCH, 1) else ""
        raise ConfigError(
            f"{where} returned shape {list(out.shape)}, expected [{_PROBE_BATCH}]{hint}"
        )
    if out.dtype != torch.float32:
        raise ConfigError(f"{where} returned dtype {out.dtype}, expected torch.float32")

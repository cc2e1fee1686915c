"""Pick a model by name or import path, validate its options, build it; the config's ModelSpec."""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import torch
from torch import nn

from daskhps.errors import ConfigError
from daskhps.models.deepfm import DeepFM
from daskhps.models.dlrm import DLRM
from daskhps.models.layers import OptionCheck
from daskhps.models.wide_deep import WideDeep

__all__ = [
    "BUILTIN_MODELS",
    "FrozenOptions",
    "ModelSpec",
    "build_model",
    "model_options",
    "resolve_model",
    "sparse_dim_of",
]

BUILTIN_MODELS: Mapping[str, type[nn.Module]] = types.MappingProxyType(
    {"dlrm": DLRM, "deepfm": DeepFM, "wide_deep": WideDeep}
)

#: Constructor arguments every model takes; all others are its options.
LAYOUT_ARGS = ("num_dense", "num_fields", "embedding_dim")

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
    params = _constructor_params(obj)
    missing = [a for a in LAYOUT_ARGS if not _takes_keyword(params, a)]
    if missing:
        raise ConfigError(
            f"model {name!r}: the constructor must take keyword arguments {list(LAYOUT_ARGS)}; "
            f"it lacks {missing} (models are built as Cls(num_dense=..., num_fields=..., "
            "embedding_dim=..., **options))"
        )
    return obj


_KW_OK = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KW_ONLY = inspect.Parameter.KEYWORD_ONLY


def _takes_keyword(params: Mapping[str, inspect.Parameter], arg: str) -> bool:
    p = params.get(arg)
    if p is None:
        return any(q.kind is q.VAR_KEYWORD for q in params.values())
    return p.kind in (_KW_OK, _KW_ONLY)


def _constructor_params(cls: type) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(cls).parameters)
    except (TypeError, ValueError):  # some C-implemented classes have no signature
        return {"kwargs": inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)}


def model_options(cls: type[nn.Module]) -> dict[str, Any] | None:
    """Options of a model class with their defaults (``inspect.Parameter.empty`` if required).

    ``None`` when the constructor takes ``**kwargs``, so that any option name is allowed.
    """
    params = _constructor_params(cls)
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return {
        n: p.default
        for n, p in params.items()
        if n not in LAYOUT_ARGS and p.kind in (_KW_OK, _KW_ONLY)
    }


class _OptionError(Exception):
    """A bad option; ``option`` is its name, or None when the problem is not one option."""

    def __init__(self, option: str | None, message: str) -> None:
        super().__init__(message)
        self.option = option
        self.message = message


def _check_options(cls: type[nn.Module], label: str, options: Mapping[str, Any]) -> None:
    """Option names against the constructor, values against its type hints; raise _OptionError."""
    allowed = model_options(cls)
    if allowed is None:
        return
    for opt in options:
        if opt in LAYOUT_ARGS:
            raise _OptionError(
                opt, f"{opt!r} is set from the data and the table, not as a model option"
            )
        if opt not in allowed:
            raise _OptionError(
                opt,
                f"unknown option {opt!r} for model {label!r}; allowed options: {sorted(allowed)}",
            )
    required = [o for o, d in allowed.items() if d is inspect.Parameter.empty and o not in options]
    if required:
        raise _OptionError(None, f"model {label!r} needs option(s) {required}")
    try:
        hints = get_type_hints(cls.__init__, include_extras=True)
    except Exception:  # unresolvable user annotations: names were checked, skip types
        hints = {}
    for opt, value in options.items():
        hint = hints.get(opt)
        if hint is None:
            continue
        if not _matches(value, hint):
            raise _OptionError(
                opt, f"option {opt!r} of model {label!r} must be {_describe(hint)}, got {value!r}"
            )
        for meta in get_args(hint)[1:] if get_origin(hint) is Annotated else ():
            if isinstance(meta, OptionCheck):
                try:
                    meta.check(label, opt, value)
                except ConfigError as e:
                    raise _OptionError(opt, str(e)) from e


def _matches(value: Any, hint: Any) -> bool:
    """Whether a config value fits a type hint; hints it does not understand accept anything."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        return _matches(value, args[0])
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is Literal:
        return value in args
    if origin in (Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin in (list, tuple, Sequence):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(map(_matches, value, args))
        return not args or all(_matches(v, args[0]) for v in value)
    if origin in (dict, Mapping):
        return isinstance(value, Mapping) and (
            not args or all(_matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items())
        )
    return True


def _describe(hint: Any) -> str:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        return _describe(args[0])
    if origin is Literal:
        return f"one of {list(args)}"
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin in (list, tuple, Sequence):
        plural = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}
        return f"a list of {plural.get(args[0], _describe(args[0]))}" if args else "a list"
    if hint is type(None):
        return "null"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


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
    name: str, *, num_dense: int, num_fields: int, embedding_dim: int, **options: Any
) -> nn.Module:
    """Build a dense CTR model.

    Parameters
    ----------
    name:
        ``"dlrm"``, ``"deepfm"``, ``"wide_deep"``, or ``"package.module:ClassName"`` of a user's
        ``nn.Module`` that follows :class:`~daskhps.models.base.CTRModel`'s interface.
    num_dense, num_fields, embedding_dim:
        Batch layout; the sparse input is ``[B, num_fields, sparse_dim_of(model, embedding_dim)]``.
    **options:
        The model's own constructor options (layer sizes, activation, dropout, ...).

    Raises
    ------
    ConfigError
        Unknown model or option, a bad option value, or a user model that breaks the interface:
        it is checked on a tiny probe batch and must return ``float32[B]`` logits.
    """
    cls = resolve_model(name)
    try:
        _check_options(cls, name, options)
    except _OptionError as e:
        raise ConfigError(e.message) from None
    layout = {"num_dense": num_dense, "num_fields": num_fields, "embedding_dim": embedding_dim}
    if cls in BUILTIN_MODELS.values():
        return cls(**layout, **options)
    try:
        model = cls(**layout, **options)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(
            f"model {name!r}: the constructor failed with {type(e).__name__}: {e}"
        ) from e
    _probe(model, name, num_dense, num_fields, sparse_dim_of(model, embedding_dim))
    return model


def _probe(model: nn.Module, name: str, num_dense: int, num_fields: int, width: int) -> None:
    """Run a user model once on a tiny batch and check the logits' shape and dtype."""
    # A private generator: probing must not move torch's global RNG, which seeds the run.
    gen = torch.Generator().manual_seed(0)
    dense = torch.randn(_PROBE_BATCH, num_dense, generator=gen)
    sparse = torch.randn(_PROBE_BATCH, num_fields, width, generator=gen)
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


class FrozenOptions(Mapping[str, Any]):
    """A read-only mapping that, unlike ``MappingProxyType``, pickles (specs travel to workers)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return repr(self._data)


def _freeze(value: Any) -> Any:
    # YAML lists become tuples and mappings read-only, so a spec cannot change after validation.
    if isinstance(value, Mapping):
        return FrozenOptions({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class ModelSpec:
    """Which dense model a run trains, validated and read-only.

    Parameters
    ----------
    name:
        A built-in model name or a ``"package.module:ClassName"`` import path.
    options:
        The model's constructor options; stored as a read-only mapping, lists as tuples.
    origin:
        Where the spec came from (``"run.yaml: model"``), for error messages only.
    """

    name: str
    # Excluded from the hash (a mapping is unhashable); equality still compares it.
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    origin: str = field(default="ModelSpec", compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"{self.origin}.name: must be a string, got {self.name!r}")
        if not isinstance(self.options, Mapping):
            raise ConfigError(f"{self.origin}.options: must be a mapping, got {self.options!r}")
        bad_keys = [k for k in self.options if not isinstance(k, str)]
        if bad_keys:
            raise ConfigError(f"{self.origin}.options: option names must be strings: {bad_keys}")
        object.__setattr__(self, "options", _freeze(self.options))
        try:
            cls = resolve_model(self.name)
        except ConfigError as e:
            raise ConfigError(f"{self.origin}.name: {e}") from e.__cause__
        try:
            _check_options(cls, self.name, self.options)
        except _OptionError as e:
            key = f"{self.origin}.options" + (f".{e.option}" if e.option else "")
            raise ConfigError(f"{key}: {e.message}") from None

    @classmethod
    def from_dict(cls, d: Any, source: str = "<config>", key: str = "model") -> ModelSpec:
        """Validate the ``model`` section of a config file.

        Parameters
        ----------
        d:
            ``{"name": str, "options": {...}}``; ``options`` may be left out.
        source:
            The file the section came from, named in every error.
        key:
            Where the section sits in that file.

        Raises
        ------
        ConfigError
            Naming ``source`` and the key: not a mapping, missing ``name``, unknown keys, wrong
            types, an unknown model or option, or a bad option value.
        """
        origin = f"{source}: {key}"
        if not isinstance(d, Mapping):
            raise ConfigError(f"{origin}: must be a mapping with 'name' and 'options', got {d!r}")
        unknown = sorted(str(k) for k in d if k not in ("name", "options"))
        if unknown:
            raise ConfigError(
                f"{origin}.{unknown[0]}: unknown key; allowed keys: ['name', 'options']"
            )
        if "name" not in d:
            raise ConfigError(
                f"{origin}.name: missing; use one of {sorted(BUILTIN_MODELS)} or "
                "'package.module:ClassName'"
            )
        options = d.get("options")
        return cls(name=d["name"], options={} if options is None else options, origin=origin)

    def to_dict(self) -> dict[str, Any]:
        """Plain ``{"name", "options"}`` (lists, dicts) that :meth:`from_dict` reads back."""
        return {"name": self.name, "options": _thaw(self.options)}

    def sparse_dim(self, embedding_dim: int) -> int:
        """Floats per key the model reads from the table, see :func:`sparse_dim_of`."""
        return sparse_dim_of(resolve_model(self.name), embedding_dim)

    def build(self, *, num_dense: int, num_fields: int, embedding_dim: int) -> nn.Module:
        """:func:`build_model` with this spec; errors are prefixed with the spec's origin."""
        try:
            return build_model(
                self.name,
                num_dense=num_dense,
                num_fields=num_fields,
                embedding_dim=embedding_dim,
                **_thaw(self.options),
            )
        except ConfigError as e:
            raise ConfigError(f"{self.origin}: {e}") from e

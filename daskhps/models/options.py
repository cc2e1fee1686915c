"""A model's options: read from its constructor's signature, checked against its type hints."""

from __future__ import annotations

import inspect
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from torch import nn

from daskhps.errors import ConfigError
from daskhps.models.layers import OptionCheck

__all__ = [
    "LAYOUT_ARGS",
    "LAYOUT_PARAM",
    "WIDTHS_ARG",
    "OptionError",
    "check_options",
    "constructor_params",
    "model_options",
    "takes_keyword",
]

#: Constructor arguments every model takes; all others but WIDTHS_ARG are its options.
LAYOUT_ARGS = ("num_dense", "num_fields", "embedding_dim")
#: The per-field widths, taken by the models that support fields of unequal widths.
WIDTHS_ARG = "field_dims"
#: The built-in models take the layout as one argument (daskhps.models.base.InputLayout).
LAYOUT_PARAM = "layout"
_NOT_OPTIONS = (*LAYOUT_ARGS, WIDTHS_ARG, LAYOUT_PARAM)

_KW_OK = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KW_ONLY = inspect.Parameter.KEYWORD_ONLY


def takes_keyword(params: Mapping[str, inspect.Parameter], arg: str) -> bool:
    p = params.get(arg)
    if p is None:
        return any(q.kind is q.VAR_KEYWORD for q in params.values())
    return p.kind in (_KW_OK, _KW_ONLY)


def constructor_params(cls: type) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(cls).parameters)
    except (TypeError, ValueError):  # some C-implemented classes have no signature
        return {"kwargs": inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)}


def model_options(cls: type[nn.Module]) -> dict[str, Any] | None:
    """Options of a model class with their defaults (``inspect.Parameter.empty`` if required).

    ``None`` when the constructor takes ``**kwargs``, so that any option name is allowed.
    """
    params = constructor_params(cls)
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return {
        n: p.default
        for n, p in params.items()
        if n not in _NOT_OPTIONS and p.kind in (_KW_OK, _KW_ONLY)
    }


class OptionError(Exception):
    """A bad option; ``option`` is its name, or None when the problem is not one option."""

    def __init__(self, option: str | None, message: str) -> None:
        super().__init__(message)
        self.option = option
        self.message = message


def check_options(cls: type[nn.Module], label: str, options: Mapping[str, Any]) -> None:
    """Option names against the constructor, values against its type hints; raise OptionError."""
    allowed = model_options(cls)
    for opt in options:
        if opt in LAYOUT_ARGS or opt == WIDTHS_ARG:
            raise OptionError(
                opt, f"{opt!r} is set from the data and the table, not as a model option"
            )
        if allowed is not None and opt not in allowed:
            raise OptionError(
                opt,
                f"unknown option {opt!r} for model {label!r}; allowed options: {sorted(allowed)}",
            )
    if allowed is None:
        return
    required = [o for o, d in allowed.items() if d is inspect.Parameter.empty and o not in options]
    if required:
        raise OptionError(None, f"model {label!r} needs option(s) {required}")
    try:
        hints = get_type_hints(cls.__init__, include_extras=True)
    except Exception:  # unresolvable user annotations: names were checked, skip types
        hints = {}
    for opt, value in options.items():
        hint = hints.get(opt)
        if hint is None:
            continue
        if not _matches(value, hint):
            raise OptionError(
                opt, f"option {opt!r} of model {label!r} must be {_describe(hint)}, got {value!r}"
            )
        for meta in get_args(hint)[1:] if get_origin(hint) is Annotated else ():
            if isinstance(meta, OptionCheck):
                try:
                    meta.check(label, opt, value)
                except ConfigError as e:
                    raise OptionError(opt, str(e)) from e


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

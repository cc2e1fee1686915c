"""The option base: :class:`Options`, the pydantic model every config section derives from, and
its errors in daskhps's words.

A section is an :class:`Options` model: each field declares the option's type, default,
bounds or choices (with the types of :mod:`daskhps.options.types`), and (the docstring below
it) its one line of documentation. Parsing, ``to_dict``, the key tree that ``--set`` checks,
the reference in docs/configuration.md and the JSON schema are all read from these
declarations.

pydantic validates; :func:`validate` turns the first error into today's one-line
:class:`~daskhps.errors.ConfigError`, with the file, the line, the dotted key and what is
allowed::

    configs/run.yaml:14: table.tiers.device.rows: must be >= 1, got 0
    configs/run.yaml:9: table.dimm: unknown key; did you mean 'table.dim'? allowed keys: ...

The coercion rules are daskhps's, not pydantic's lax ones: models are strict (a bool is no
int, a string is no number), an int is a float, and a whole float below 2**53 is an int
(YAML reads ``1e6`` as a float: :data:`~daskhps.options.types.Int`).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

# BaseModel's metaclass, which pydantic exports only from this module
from pydantic._internal._model_construction import ModelMetaclass
from pydantic.fields import FieldInfo

from daskhps.errors import ConfigError
from daskhps.options.annotations import item, literals, members, noun_of, plain_number, strip
from daskhps.options.context import Ctx, closest, join

__all__ = ["Options", "options_in", "type_name", "validate"]

S = TypeVar("S", bound="Options")


class _Checked(ModelMetaclass):
    """Options built in code (``OptimizerSpec(lr=0)``) fail with the same one-line
    :class:`ConfigError` as a config file's, named after the class. A metaclass, not an
    ``__init__``: pydantic validates a model with its own ``__init__`` through that
    ``__init__``, without the validation context the sections' defaults need."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except ValidationError as e:
            raise _config_error(e, cls, Ctx(f"<{cls.__name__}>"), "") from None  # type: ignore[arg-type]


class Options(BaseModel, metaclass=_Checked):
    """A config section: frozen, strict, no unknown keys; null means every default."""

    model_config = ConfigDict(
        frozen=True,
        strict=True,
        extra="forbid",
        use_attribute_docstrings=True,
        arbitrary_types_allowed=True,
    )

    # Keys whose null means their default (a YAML key left empty), not a value.
    NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, data: Any) -> Any:
        if data is None:
            return {}
        if isinstance(data, dict) and cls.NULL_IS_DEFAULT:
            return {k: v for k, v in data.items() if not (v is None and k in cls.NULL_IS_DEFAULT)}
        return data

    @classmethod
    def from_dict(cls: type[S], d: Any, source: str = "<dict>", prefix: str = "") -> S:
        """``d`` validated as this section; errors name ``source`` and keys under ``prefix``."""
        return validate(cls, d, Ctx(source), prefix)

    @classmethod
    def key_names(cls) -> tuple[str, ...]:
        """The section's keys, in declaration order."""
        return tuple(cls.model_fields)

    def replace(self: S, **changes: Any) -> S:
        """A copy with ``changes``, validated like the original."""
        return type(self)(**{**dict(self), **changes})

    def to_dict(self) -> dict[str, Any]:
        """Plain values (lists, not tuples) that :func:`validate` reads back to an equal section."""
        return {k: _plain(getattr(self, k)) for k in type(self).model_fields}


def _plain(value: Any) -> Any:
    if isinstance(value, Options):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def validate(
    model: type[S], data: Any, ctx: Ctx, prefix: str, context: Mapping[str, Any] | None = None
) -> S:
    """``data`` (a section as read from YAML) as ``model``; the first problem is a
    :class:`ConfigError` located in ``ctx``'s file under ``prefix``."""
    try:
        return model.model_validate(data, context=dict(context or {}))
    except ValidationError as e:
        raise _config_error(e, model, ctx, prefix) from None


# --- errors -----------------------------------------------------------------------------------

_BOUNDS = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}


def _config_error(e: ValidationError, model: type[Options], ctx: Ctx, prefix: str) -> ConfigError:
    errors = e.errors(include_url=False)
    err, missing = _first(errors)
    key, node, field, declared = _walk(model, err["loc"], prefix)
    kind, value = err["type"], err.get("input")
    info = err.get("ctx") or {}
    if kind == "daskhps":
        sub = info["key"]
        return ctx.error(join(key, sub) if sub else key, info["message"])
    if kind == "extra_forbidden":
        allowed = node.key_names()
        name = str(err["loc"][-1])
        hint = closest(name, missing) or closest(name, list(allowed))
        did = f"did you mean {join(_parent(key), hint)!r}? " if hint else ""
        return ctx.error(key, f"unknown key; {did}allowed keys: {', '.join(allowed)}")
    if kind == "missing":
        return ctx.error(key, "required key is missing")
    if kind in ("model_type", "model_attributes_type", "dict_type") and field is None:
        keys = ", ".join(node.key_names())
        return ctx.error(key, f"expected a mapping with keys {keys}; got {value!r}")
    if kind in _BOUNDS:
        op, name = _BOUNDS[kind]
        return ctx.error(key, f"must be {op} {info[name]}, got {value!r}{_interval(declared)}")
    if kind == "literal_error" and field is not None:
        choices, noun = literals(field), noun_of(field)
        if noun is not None:
            named = ", ".join(_yaml_repr(c) if c is None else str(c) for c in choices)
            return ctx.error(key, f"{value!r} is not a {noun}; choose from {named}")
        shown = ", ".join(_yaml_repr(c) for c in choices)
        return ctx.error(key, f"{_yaml_repr(value)} is not allowed; choose one of {shown}")
    if kind in ("string_too_short", "string_too_long"):
        return ctx.error(key, f"{_length(kind, info)}, got {value!r}")
    if kind == "finite_number":
        return ctx.error(key, f"must be a finite number, got {value!r}")
    if kind in ("value_error", "assertion_error"):
        return ctx.error(key, str(info.get("error", err["msg"])))
    if field is not None:  # a type error: say what the declaration allows
        got = "null" if value is None else f"{type(value).__name__} {value!r}"  # a key left empty
        return ctx.error(key, f"expected {type_name(field)}, got {got}")
    return ctx.error(key, err["msg"])


def _first(errors: list[Any]) -> tuple[Any, list[str]]:
    """The error to report, and the required keys missing from its mapping. pydantic lists
    a missing key before an unknown one, but a required key misspelled (``featurs:``) is
    both, and only the unknown key has a line and a key to suggest (the missing ones first):
    an unknown key of the mapping of the first missing one is reported instead."""
    first = errors[0]
    if first["type"] != "missing":
        return first, []
    at = first["loc"][:-1]
    missing = [str(x["loc"][-1]) for x in errors if x["type"] == "missing" and x["loc"][:-1] == at]
    for x in errors:
        if x["type"] == "extra_forbidden" and x["loc"][:-1] == at:
            return x, missing
    return first, []


def _yaml_repr(value: Any) -> str:
    """``value`` in the words of the YAML that wrote it: None is null."""
    return "null" if value is None else repr(value)


def _length(kind: str, info: Mapping[str, Any]) -> str:
    if kind == "string_too_short":
        n = info["min_length"]
        return "must not be empty" if n == 1 else f"must be at least {n} characters"
    n = info["max_length"]
    return "must be one character" if n == 1 else f"must be at most {n} characters"


def _parent(key: str) -> str:
    return key.rpartition(".")[0]


def _walk(
    model: type[Options], loc: tuple[Any, ...], prefix: str
) -> tuple[str, Any, Any, FieldInfo | None]:
    """The dotted key of ``loc`` (pydantic's path, union tags dropped), the model that holds
    its last field, that field's annotation (None when the path ends at a model) and its
    declaration."""
    key, node, field, info = prefix, model, None, None
    for part in loc:
        if isinstance(part, int):
            key = f"{key}[{part}]"
            field = item(field)
            inner = options_in(field)
            if inner is not None:  # a list of sections (a schema's fields)
                node, field = inner, None
            continue
        if isinstance(node, type) and issubclass(node, Options) and part in node.model_fields:
            key = join(key, part)
            info = node.model_fields[part]
            field = info.annotation
            inner = options_in(field)
            if inner is not None:
                node, field = inner, None
            continue
        if isinstance(node, type) and issubclass(node, Options) and field is None:
            key = join(key, str(part))  # an unknown key of this section
            break
        break  # a union member's tag, or a part of a value: the key is complete
    return key, node, field, info


def _interval(info: FieldInfo | None) -> str:
    """``; allowed: (0, 1)`` for a field bounded on both sides, else ''."""
    if info is None:
        return ""
    b = {
        name: getattr(m, name)
        for m in info.metadata
        for name in ("ge", "gt", "le", "lt")
        if hasattr(m, name)
    }
    lo = ("[", b["ge"]) if "ge" in b else ("(", b["gt"]) if "gt" in b else None
    hi = ("]", b["le"]) if "le" in b else (")", b["lt"]) if "lt" in b else None
    if lo is None or hi is None:
        return ""
    return f"; allowed: {lo[0]}{plain_number(lo[1])}, {plain_number(hi[1])}{hi[0]}"


def options_in(annotation: Any) -> type[Options] | None:
    """The section inside ``annotation`` (``X``, ``X | None``), if it is one."""
    for t in (annotation, *members(annotation)):
        if isinstance(t, type) and issubclass(t, Options):
            return t
    return None


_NAMES = {int: "int", float: "float", bool: "bool", str: "str", type(None): "null"}


def type_name(annotation: Any) -> str:
    """``int or null``: what a declaration accepts, in the words of the YAML a user writes."""
    t = strip(annotation)
    if get_origin(t) in (Union, types.UnionType):
        return " or ".join(dict.fromkeys(type_name(m) for m in get_args(t)))
    if get_origin(t) is Literal:
        return " or ".join(dict.fromkeys(_NAMES.get(type(a), "str") for a in get_args(t)))
    if get_origin(t) in (tuple, list) or t in (tuple, list):
        return "list"
    if get_origin(t) in (dict, Mapping) or t in (dict, Mapping):
        return "mapping"
    if isinstance(t, type) and issubclass(t, Options):
        return "mapping"
    return _NAMES.get(t, getattr(t, "__name__", str(t)))

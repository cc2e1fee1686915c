"""What an option's declaration is written with: the annotated types daskhps coerces its own
way, the choice's noun, how the reference shows a value, and a section's cross-field problem.

The coercion rules are daskhps's, not pydantic's lax ones: an int is a whole number (YAML
reads ``1e6`` as a float, and a whole float below 2**53 is the int it names), a list is a
tuple (a frozen config holds no mutable lists), a size may be written as text (``'64MiB'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import BeforeValidator
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError

__all__ = ["SIZE_JSON", "Int", "Noun", "Problem", "Seq", "parse_size", "shown"]


def _whole(value: Any) -> Any:
    """1e6 reads as a float in YAML; a whole float is the int it names."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _seq(value: Any) -> Any:
    """A YAML list is the option's tuple (a frozen config holds no mutable lists)."""
    return tuple(value) if isinstance(value, list) else value


Int = Annotated[int, BeforeValidator(_whole)]
# A byte count in a config: an int, a size such as "64MiB", or null (the JSON schema's view).
SIZE_JSON: JsonDict = {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]}
T = TypeVar("T")
Seq = Annotated[tuple[T, ...], BeforeValidator(_seq)]


@dataclass(frozen=True)
class Noun:
    """What one of a set of choices is called (``Annotated[Literal[...], Noun("metric")]``):
    a wrong value reads "'f1' is not a metric; choose from auc, logloss, ..."."""

    noun: str


class Problem(PydanticCustomError):
    """A check across fields of one section, raised in its validators: ``key`` is the dotted
    key under the section that the message is about ('' for the section itself)."""

    def __new__(cls, key: str, message: str) -> Problem:
        return super().__new__(cls, "daskhps", "{message}", {"key": key, "message": message})


def shown(type: str | None = None, default: str | None = None) -> JsonDict:
    """How the reference shows an option whose type or default its declaration cannot say
    (a path; a default derived from another key): the field's ``json_schema_extra``."""
    out: JsonDict = {}
    if type is not None:
        out["x-daskhps-type"] = type
    if default is not None:
        out["x-daskhps-default"] = default
    return out


def parse_size(value: Any, forms: str) -> Any:
    """A byte count written as a size (``'64MiB'``, ``'500MB'``) as an int; other values as
    they are (the field's type checks them). ``forms`` says what the option takes."""
    if not isinstance(value, str):
        return value
    from dask.utils import parse_bytes  # dask only when a size is written as text

    try:
        return int(parse_bytes(value))
    except ValueError:
        raise Problem("", f"{value!r}: expected {forms}") from None

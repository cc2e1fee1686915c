"""Reading a declaration's annotation: the members of a union, the choices of a ``Literal``
and their :class:`~daskhps.options.types.Noun`, with ``Annotated`` stripped. Used by the
errors (what a declaration allows) and by the configuration reference."""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from daskhps.options.types import Noun

__all__ = [
    "item",
    "literal_args",
    "literals",
    "members",
    "noun_of",
    "plain_number",
    "strip",
    "union_members",
]


def strip(annotation: Any) -> Any:
    """``annotation`` without its ``Annotated`` layers."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def members(annotation: Any) -> tuple[Any, ...]:
    """Every member of a (nested) union, each with and without its ``Annotated``; or ()."""
    if get_origin(annotation) is Annotated:
        return members(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(a for m in get_args(annotation) for a in (m, *members(m)))
    return ()


def item(annotation: Any) -> Any:
    """The item type of a sequence annotation (``tuple[X, ...]``: X), or None."""
    base = strip(annotation)
    args = get_args(base)
    return args[0] if args else None


def union_members(annotation: Any) -> tuple[Any, ...]:
    """The members of a union (``int | None``: int, NoneType), Annotated stripped; or ()."""
    t = strip(annotation)
    if get_origin(t) in (Union, types.UnionType):
        return tuple(strip(m) for m in get_args(t))
    return ()


def literal_args(annotation: Any) -> tuple[Any, ...]:
    """The choices of a ``Literal`` (Annotated stripped); () if it is none."""
    t = strip(annotation)
    return get_args(t) if get_origin(t) is Literal else ()


def noun_of(annotation: Any) -> str | None:
    """What the choices of ``annotation`` are called (its :class:`Noun`), or None."""
    for t in (annotation, *members(annotation)):
        if get_origin(t) is Annotated:
            for meta in get_args(t)[1:]:
                if isinstance(meta, Noun):
                    return meta.noun
    return None


def literals(annotation: Any) -> list[Any]:
    """Every choice of ``annotation``'s literals, null first when it is allowed."""
    out: list[Any] = []
    for t in (annotation, *members(annotation)):
        t = strip(t)
        if get_origin(t) is Literal:
            out.extend(get_args(t))
        elif t is type(None) and out:
            out.insert(0, None)
    return out


def plain_number(x: Any) -> str:
    """``1.0`` as ``1``: bounds as a user writes them."""
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)

"""The option base: how a component declares its options and how a bad value is reported.

Below every component that has options (data/, passes/, table/, tiers/) and below
:mod:`daskhps.config`, which composes their sections into the run config; it imports no
daskhps package but :mod:`daskhps.errors`.

- :mod:`~daskhps.options.context`: where a config came from (:class:`Ctx`), errors located
  at a file's line and a dotted key.
- :mod:`~daskhps.options.types`: what a declaration is written with (:data:`Int`,
  :data:`Seq`, :class:`Noun`, :func:`shown`, :func:`parse_size`, :class:`Problem`).
- :mod:`~daskhps.options.annotations`: reading a declaration's annotation.
- :mod:`~daskhps.options.base`: :class:`Options`, the model of every section, and
  :func:`validate`, which turns pydantic's first error into one
  :class:`~daskhps.errors.ConfigError` line.
"""

from __future__ import annotations

from daskhps.options.annotations import literal_args, plain_number, union_members
from daskhps.options.base import Options, options_in, type_name, validate
from daskhps.options.context import Ctx, closest, join, values_written
from daskhps.options.types import SIZE_JSON, Int, Noun, Problem, Seq, parse_size, shown

__all__ = [
    "SIZE_JSON",
    "Ctx",
    "Int",
    "Noun",
    "Options",
    "Problem",
    "Seq",
    "closest",
    "join",
    "literal_args",
    "options_in",
    "parse_size",
    "plain_number",
    "shown",
    "type_name",
    "union_members",
    "validate",
    "values_written",
]

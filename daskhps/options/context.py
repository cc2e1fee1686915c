"""Validation context: which file a section came from, where each key sits, precise errors.

The options themselves are declared and checked in :mod:`daskhps.options.base`; this is
where an error is located. ``section`` places the errors of the one component that checks its
own section (a model's options, against its class) under their key.

Every error message starts with a location and the dotted key::

    configs/run.yaml:14: table.tiers.device.rows: must be >= 1, got 0
    configs/run.yaml (--set table.dim): table.dim: expected int, got str 'x'
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from daskhps.errors import ConfigError, ConfigKeyError

__all__ = ["Ctx", "closest", "join"]


def join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _parent(key: str) -> str:
    if key.endswith("]"):
        return key[: key.rindex("[")]
    return key.rpartition(".")[0]


def _ancestors(key: str) -> Iterator[str]:
    """``key``, then each key above it (``a.b[0].c``, ``a.b[0]``, ``a.b``, ``a``)."""
    while key:
        yield key
        key = _parent(key)


def closest(name: str, candidates: Sequence[str]) -> str | None:
    """The candidate most like ``name`` (typos, a missing section prefix), or None."""
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    if not found:  # "dim" for "table.dim": match on the last component too
        tail = name.rpartition(".")[2]
        found = [c for c in candidates if c.rpartition(".")[2] == tail][:1]
    if not found:  # "ttl" for "ttl_days": too short for difflib; the one key it begins
        found = [c for c in candidates if c.startswith(name + "_")]
        found = found if len(found) == 1 else []
    return found[0] if found else None


@dataclass(frozen=True)
class Ctx:
    """Where a config came from: ``source`` (a file or ``<dict>``), the line of every dotted key
    and the keys set by ``--set`` overrides."""

    source: str = "<dict>"
    lines: Mapping[str, int] = field(default_factory=dict)
    overridden: frozenset[str] = frozenset()

    def where(self, key: str) -> str:
        """``file (--set k)`` when ``key`` or a key above it was set by ``--set k``, else
        ``file:line`` of ``key`` or of its nearest ancestor that the file names."""
        # A --set value replaces all of the file's value below its key: a key inside it is
        # the override's even where the file wrote the same key (``--set tables=[...]`` over
        # a file's ``tables``), so the overrides are looked at before any line.
        for k in _ancestors(key):
            if k in self.overridden:
                return f"{self.source} (--set {k})"
        for k in _ancestors(key):
            if k in self.lines:
                return f"{self.source}:{self.lines[k]}"
        return self.source

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where(key)}: {key or '<top>'}: {message}")

    def mapping(self, d: Any, allowed: Sequence[str], prefix: str) -> dict[str, Any]:
        """``d`` (None = empty) as a dict whose keys are all in ``allowed``."""
        if d is None:
            return {}
        if not isinstance(d, Mapping):
            raise self.error(
                prefix, f"expected a mapping with keys {', '.join(allowed)}; got {d!r}"
            )
        for k in d:
            if k not in allowed:
                hint = closest(str(k), allowed)
                did = f"did you mean {join(prefix, hint)!r}? " if hint else ""
                raise self.error(
                    join(prefix, str(k)),
                    f"unknown key; {did}allowed keys: {', '.join(allowed)}",
                )
        return dict(d)

    @contextmanager
    def section(self, prefix: str) -> Iterator[None]:
        """Re-raise the :class:`ConfigKeyError` of a component that checks its own section (a
        model's options) with this file's line and the key under ``prefix``."""
        try:
            yield
        except ConfigKeyError as e:
            raise self.error(join(prefix, e.key), e.reason) from e

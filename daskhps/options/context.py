"""Validation context: which file a section came from, where each key sits, precise errors.

The options themselves are declared and checked in :mod:`daskhps.options.base`; this is
where an error is located. ``section`` places the errors of the one component that checks its
own section (a model's options, against its class) under their key.

Every error message starts with a location and the dotted key::

    configs/run.yaml:14: table.tiers.device.rows: must be >= 1, got 0
    configs/run.yaml (--set table.dim): table.dim: expected int, got str 'x'

A loaded config keeps its context, so a later message about one of its values (a resume's
refused change) says where that value was written: :meth:`Ctx.origin`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from daskhps.errors import ConfigError, ConfigKeyError

__all__ = ["Ctx", "closest", "join", "values_written"]


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


def values_written(d: Any, prefix: str = "") -> frozenset[str]:
    """The dotted keys of ``d`` (a config as read) that hold a value: not a mapping, whose
    keys do, nor a list of mappings, whose items' keys do (``tables[1].dim``)."""
    if isinstance(d, Mapping):
        items = [(join(prefix, str(k)), v) for k, v in d.items()]
    elif isinstance(d, list) and d and all(isinstance(v, Mapping) for v in d):
        items = [(f"{prefix}[{i}]", v) for i, v in enumerate(d)]
    else:
        return frozenset([prefix]) if prefix else frozenset()
    return frozenset().union(*(values_written(v, k) for k, v in items))


@dataclass(frozen=True)
class Ctx:
    """Where a config came from: ``source`` (a file or ``<dict>``), the line of every dotted key
    and the keys set by ``--set`` overrides. Once the config is read, also the keys it writes a
    value for (``written``, :func:`values_written`) and the keys whose value is another key's
    (``taken``: ``tables[0].dim`` left out is ``table.dim``)."""

    source: str = "<dict>"
    lines: Mapping[str, int] = field(default_factory=dict)
    overridden: frozenset[str] = frozenset()
    written: frozenset[str] = frozenset()
    taken: Mapping[str, str] = field(default_factory=dict)

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

    def origin(self, key: str) -> tuple[str, str | None]:
        """``(k, where)``: the key ``k`` that writes ``key``'s value (``key`` itself, a key above
        it written as one value, or the key it takes its value from, followed to the end) and
        :meth:`where` ``k`` is written; ``where`` is None when nothing writes it (a default)."""
        k = key
        for _ in range(len(self.taken)):  # a key taken from one taken in turn
            above = next((a for a in _ancestors(k) if a in self.taken), None)
            if above is None:
                break
            k = self.taken[above] + k[len(above) :]
        for a in _ancestors(k):
            if a in self.written:
                return a, self.where(a)
        if any(w.startswith((f"{k}.", f"{k}[")) for w in self.written):
            return k, self.where(k)  # written in parts, as another form of the value
        return k, None

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

"""Validation context: which file a section came from, where each key sits, precise errors.

The options themselves are declared and checked in :mod:`daskhps.config._options`; this is
where an error is located. ``section`` still places the messages of the two components that
check their own input (a model's options against its class, an inline schema) under their key.

Every error message starts with a location and the dotted key::

    configs/run.yaml:14: table.tiers.device.rows: must be >= 1, got 0
    configs/run.yaml (--set table.dim): table.dim: expected int, got str 'x'
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from daskhps.errors import ConfigError

__all__ = ["Ctx", "closest", "join"]

_KEY = re.compile(r"^[A-Za-z_][\w.\[\]]*$")


def join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _parent(key: str) -> str:
    if key.endswith("]"):
        return key[: key.rindex("[")]
    return key.rpartition(".")[0]


def closest(name: str, candidates: Sequence[str]) -> str | None:
    """The candidate most like ``name`` (typos, a missing section prefix), or None."""
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    if not found:  # "dim" for "table.dim": match on the last component too
        tail = name.rpartition(".")[2]
        found = [c for c in candidates if c.rpartition(".")[2] == tail][:1]
    return found[0] if found else None


@dataclass(frozen=True)
class Ctx:
    """Where a config came from: ``source`` (a file or ``<dict>``), the line of every dotted key
    and the keys set by ``--set`` overrides."""

    source: str = "<dict>"
    lines: Mapping[str, int] = field(default_factory=dict)
    overridden: frozenset[str] = frozenset()

    def where(self, key: str) -> str:
        """``file:line`` of ``key`` or of its nearest ancestor that the file names."""
        k = key
        while k:
            if k in self.overridden:
                return f"{self.source} (--set {k})"
            if k in self.lines:
                return f"{self.source}:{self.lines[k]}"
            k = _parent(k)
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
    def section(self, prefix: str, alias: str | None = None) -> Iterator[None]:
        """Re-raise a ConfigError of a component's own ``from_dict`` or constructor with this
        file's location and the key under ``prefix``.

        Components word their errors as ``source: key: ...``, ``alias: key: ...`` (e.g.
        ``generator: days: ...``) or free text; each form is mapped to a dotted key here.
        """
        try:
            yield
        except ConfigError as e:
            raise self._relocate(str(e), prefix, alias) from e

    def _relocate(self, msg: str, prefix: str, alias: str | None) -> ConfigError:
        rest = msg
        for head in (f"{self.source}: ", f"{alias}: " if alias else None):
            if head and rest.startswith(head):
                rest = rest[len(head) :]
        key, sep, tail = rest.partition(": ")
        if sep and _KEY.match(key):
            if not (key == prefix or key.startswith(f"{prefix}.") or key.startswith(prefix + "[")):
                key = join(prefix, key)
            return ConfigError(f"{self.where(key)}: {key}: {tail}")
        return ConfigError(f"{self.where(prefix)}: {prefix}: {rest}")

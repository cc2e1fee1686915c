"""Validation context: which file a section came from, where each key sits, precise errors.

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

__all__ = ["MISSING", "Ctx", "closest", "join", "size_bytes"]

MISSING: Any = object()
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

    def get(
        self,
        d: Mapping[str, Any],
        prefix: str,
        key: str,
        types: type | tuple[type, ...],
        default: Any = MISSING,
        *,
        choices: Sequence[Any] | None = None,
        minimum: float | None = None,
        maximum: float | None = None,
        below: float | None = None,
    ) -> Any:
        """``d[key]`` checked against types (bool is no int; an int is a float), choices and
        bounds (``below`` is a strict upper bound)."""
        name = join(prefix, key)
        if key not in d:
            if default is MISSING:
                raise self.error(name, "required key is missing")
            return default
        value = d[key]
        tt = types if isinstance(types, tuple) else (types,)
        if isinstance(value, bool) and bool not in tt:
            ok = False
        elif float in tt and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        elif int in tt and isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            ok, value = True, int(value)  # 1e6 reads as a float; it is a whole number
        else:
            ok = isinstance(value, tt)
        if not ok:
            allowed = " or ".join("null" if t is type(None) else t.__name__ for t in tt)
            raise self.error(name, f"expected {allowed}, got {type(value).__name__} {value!r}")
        if choices is not None and value not in choices:
            raise self.error(
                name, f"{value!r} is not allowed; choose one of {', '.join(map(repr, choices))}"
            )
        if value is not None and not isinstance(value, str):
            if minimum is not None and value < minimum:
                raise self.error(name, f"must be >= {minimum}, got {value!r}")
            if maximum is not None and value > maximum:
                raise self.error(name, f"must be <= {maximum}, got {value!r}")
            if below is not None and value >= below:
                raise self.error(name, f"must be < {below}, got {value!r}")
        return value

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


def size_bytes(ctx: Ctx, key: str, value: int | str, forms: str) -> int:
    """A byte count given as an int or a size (``'64MiB'``, ``'500MB'``); a string that is
    not a size is a :class:`ConfigError` naming ``key`` and the ``forms`` it takes."""
    if not isinstance(value, str):
        return int(value)
    from dask.utils import parse_bytes  # dask only when a size is written as text

    try:
        return int(parse_bytes(value))
    except ValueError:
        raise ctx.error(key, f"{value!r}: expected {forms}") from None

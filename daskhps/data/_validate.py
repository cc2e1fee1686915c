"""Small helpers that turn YAML mappings into frozen dataclasses with precise errors.

Every error names the source (a file name or ``<dict>``), the dotted key and what is allowed,
so a user can fix the config without reading code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from daskhps._yaml import load_yaml_with_lines
from daskhps.errors import ConfigError

__all__ = ["check_keys", "get", "load_yaml", "where"]

_MISSING = object()


def where(source: str, key: str) -> str:
    return f"{source}: {key}" if key else source


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing file, bad YAML or a non-mapping is a ConfigError naming
    the file (and the line of a syntax error). The same loader as run configs."""
    return load_yaml_with_lines(path)[0]


def check_keys(d: Any, allowed: Sequence[str], source: str, prefix: str = "") -> dict[str, Any]:
    """``d`` must be a mapping whose keys are all in ``allowed``."""
    if not isinstance(d, Mapping):
        raise ConfigError(
            f"{where(source, prefix or '<top>')}: expected a mapping, got {type(d).__name__}"
        )
    unknown = sorted(str(k) for k in d if k not in allowed)
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(
            f"{where(source, key)}: unknown key; allowed keys are {', '.join(sorted(allowed))}"
        )
    return dict(d)


def get(
    d: Mapping[str, Any],
    key: str,
    types: type | tuple[type, ...],
    source: str,
    prefix: str = "",
    default: Any = _MISSING,
    choices: Sequence[Any] | None = None,
    minimum: float | None = None,
) -> Any:
    """``d[key]`` checked against ``types`` (bool is never an int here), choices and minimum."""
    name = f"{prefix}.{key}" if prefix else key
    if key not in d:
        if default is _MISSING:
            raise ConfigError(f"{where(source, name)}: required key is missing")
        return default
    value = d[key]
    tt = types if isinstance(types, tuple) else (types,)
    ok = isinstance(value, tt) and not (isinstance(value, bool) and bool not in tt)
    if float in tt and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        allowed = " or ".join(t.__name__ for t in tt)
        raise ConfigError(
            f"{where(source, name)}: expected {allowed}, got {type(value).__name__} {value!r}"
        )
    if choices is not None and value not in choices:
        raise ConfigError(
            f"{where(source, name)}: {value!r} is not allowed; choose one of "
            + ", ".join(repr(c) for c in choices)
        )
    if minimum is not None and value is not None and value < minimum:
        raise ConfigError(f"{where(source, name)}: must be >= {minimum}, got {value!r}")
    return value

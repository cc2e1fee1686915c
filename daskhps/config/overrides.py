"""``--set key=value`` overrides: dotted keys, values read as YAML, applied before validation."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

from daskhps._yaml import parse_scalar
from daskhps.config._keys import LISTS, all_keys, free_form
from daskhps.errors import ConfigError
from daskhps.options import closest

__all__ = ["apply_overrides", "parse_override"]


def parse_override(text: str, source: str = "<dict>") -> tuple[str, Any]:
    """``"table.dim=32"`` -> ``("table.dim", 32)``; the value is a YAML scalar or flow list.
    An error names ``source`` (the config file the override applies to)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. --set table.dim=32")
    try:
        return key, parse_scalar(value.strip())
    except ConfigError as e:  # a value YAML cannot read, and what to write instead
        raise ConfigError(f"{source} (--set {key}): {key}: {e}") from None


def apply_overrides(
    d: Mapping[str, Any], overrides: Iterable[str], source: str = "<dict>"
) -> tuple[dict[str, Any], frozenset[str]]:
    """A copy of ``d`` with every override applied, and the set of keys they set.

    An unknown key is a :class:`ConfigError` that names the closest valid key.
    """
    out = copy.deepcopy(dict(d))
    known = all_keys()
    done: set[str] = set()
    for text in overrides:
        key, value = parse_override(text, source)
        # Before the unknown-key check: tables[0].dim and tables.0.dim are unknown keys too,
        # whose closest known key (tables.dim) could not be set either.
        section = re.split(r"[.\[]", key, maxsplit=1)[0]
        if section in LISTS and key != section:
            raise ConfigError(
                f"{source} (--set {key}): {key}: {section} is a list; set it whole, e.g. "
                f"--set '{section}=[{{name: ids, dim: 32, features: [C3, C4]}}]'"
            )
        if key not in known and not free_form(key):
            hint = closest(key, known)
            did = f"; did you mean {hint}?" if hint else ""
            raise ConfigError(f"{source} (--set {key}): {key}: unknown key{did}")
        node = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(
                    f"{source} (--set {key}): {where} is {child!r}, not a mapping; "
                    f"set {where} itself instead"
                )
            node = child
        node[parts[-1]] = value
        done.add(key)
    return out, frozenset(done)

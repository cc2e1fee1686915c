"""YAML in and out: a loader that keeps dates as strings and reads ``1e-3`` as a float, and a
map from every dotted key of a file to its line, so errors can point at the line to fix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from daskhps.errors import ConfigError

__all__ = ["dump_yaml", "load_yaml_with_lines", "parse_scalar"]

_TIMESTAMP = "tag:yaml.org,2002:timestamp"
# YAML 1.1 (PyYAML) needs a dot in a float: "1e-3" would be the string '1e-3'. Learning rates
# are written that way, so accept YAML 1.2 exponent floats too.
_EXP_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


# A field range (C{1..3}, data.schema's and tables' features) in a flow list or mapping: there
# YAML reads its brace as the start of a mapping, and the error it gives says nothing of ranges.
_RANGE = re.compile(r"[^\s\[\]{},:'\"]*\{\d+\.\.\d+\}[^\s\[\]{},:'\"]*")


class _Loader(yaml.SafeLoader):
    """SafeLoader without timestamps (``day: 2024-01-02`` stays a string) and with 1e-3 floats."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _TIMESTAMP]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXP_FLOAT, list("-+0123456789"))


def _lines(node: yaml.Node, prefix: str, out: dict[str, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            out[key] = key_node.start_mark.line + 1
            _lines(value_node, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            key = f"{prefix}[{i}]"
            out[key] = item.start_mark.line + 1
            _lines(item, key, out)


def load_yaml_with_lines(path: str | Path) -> tuple[dict[str, Any], dict[str, int]]:
    """The mapping in ``path`` and ``{dotted key: line}``; unreadable or bad YAML is a
    :class:`ConfigError` naming the file (and the line, for syntax errors)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the file ({e.strerror or e})") from e
    try:
        node = yaml.compose(text, Loader=_Loader)
        data = yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader: no arbitrary objects
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e)
        hint = _range_hint(text, e)
        raise ConfigError(f"{at}: not valid YAML ({problem}){': ' + hint if hint else ''}") from e
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    lines: dict[str, int] = {}
    if node is not None:
        _lines(node, "", lines)
    return data, lines


def _range_hint(text: str, e: yaml.YAMLError) -> str | None:
    """What to do when the YAML error ``e`` in ``text`` is at an unquoted range's brace."""
    mark = getattr(e, "problem_mark", None)
    lines = text.splitlines()
    if mark is None or mark.line >= len(lines):
        return None
    for m in _RANGE.finditer(lines[mark.line]):
        if m.start() <= mark.column < m.end():
            r = m.group()
            return (
                f'inside [...] or {{...}} YAML reads the brace of {r} as a mapping; quote it: "{r}"'
            )
    return None


def parse_scalar(text: str) -> Any:
    """A ``--set`` value: a YAML scalar or flow list/mapping (``4``, ``1e-3``, ``[a, b]``).

    Raises
    ------
    ConfigError
        For a range left unquoted in a flow list (``[C{1..3}]``): the string typed would be
        refused as a value saying nothing of the quotes it lacks.
    """
    try:
        return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader: no arbitrary objects
    except yaml.YAMLError as e:
        hint = _range_hint(text, e)
        if hint is not None:
            raise ConfigError(f"not valid YAML: {hint}") from None
        return text  # not YAML: take it as the string the user typed


def dump_yaml(data: Any) -> str:
    """Block-style YAML in the given key order."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)

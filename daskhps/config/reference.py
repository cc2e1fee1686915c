"""The configuration reference: type, default and meaning of every key, rendered as the tables
of docs/configuration.md. Defaults are read from the loader (a minimal config, resolved), so
the document cannot disagree with the code; a test checks both ways.

Regenerate the document with ``python -m daskhps.config.reference docs/configuration.md``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from daskhps.config._keys import LISTS, key_tree, section_models
from daskhps.config.runconfig import RunConfig
from daskhps.data.schema import CategoricalField, DenseField, Schema
from daskhps.models import BUILTIN_MODELS
from daskhps.options import (
    literal_args,
    options_in,
    plain_number,
    type_name,
    union_members,
)

__all__ = [
    "DOCS",
    "declared",
    "defaults",
    "describe",
    "render",
    "render_schema",
    "update_document",
]

# The model section: its name and free-form options are checked against the model class
# (daskhps.models.spec), not declared here. Every other option is read from its declaration
# (:func:`describe`): key: (type, meaning) or (type, meaning, default shown). The built-in
# model names are read from the registry, so a new built-in is documented here by itself.
DOCS: dict[str, tuple[str, ...]] = {
    "model.name": (
        "str",
        ", ".join(f"`{name}`" for name in BUILTIN_MODELS) + " or `package.module:Class`.",
    ),
    "model.options": ("mapping", "The model's constructor options (docs/models.md)."),
}
_SECTION_TEXT = {
    "run": "The run: its name, directory and seed.",
    "data": "Training logs, schema, bad rows, holdout.",
    "passes": "How the training rows are cut into passes and global batches.",
    "table": "The embedding table, its sparse optimizer and its tiers.",
    "tables": "Embedding tables beside the default one: a list of mappings with these keys, "
    "each holding some categorical fields (see [Several tables](#several-tables)).",
    "model": "The dense model (`daskhps.models`).",
    "dense_optimizer": "The dense model's optimizer and learning-rate schedule.",
    "cluster": "The Dask cluster: embedded (default) or an existing scheduler.",
    "eval": "Evaluation on `data.holdout`.",
    "checkpoint": "Checkpoints of the run (docs/checkpoints.md).",
    "retrain": "The publish guard of `daskhps retrain` (docs/retraining.md).",
    "storage": "How object storage is reached: fsspec options per protocol, never written to "
    "the run folder (docs/operations.md).",
}
# Sample configs whose resolved values are the defaults (each holds the alternative the
# other leaves out: train files vs generated logs, a holdout).
_SAMPLES: tuple[dict[str, Any], ...] = (
    {"data": {"generate": {}}},
    {"data": {"train": {"paths": "logs"}, "holdout": {"fraction": 0.1}}},
)


def declared(key: str) -> FieldInfo | None:
    """The field that declares ``key`` (``table.tiers.policy``), or None."""
    section, *parts = key.split(".")
    node: Any = section_models().get(section)
    info = None
    for part in parts:
        if node is None or part not in node.model_fields:
            return None
        info = node.model_fields[part]
        node = options_in(info.annotation)
    return info


def describe(key: str) -> tuple[str, ...]:
    """(type, meaning) of ``key``, and the default to show where it depends on other keys."""
    info = declared(key)
    if info is None:
        return DOCS[key]
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    typ = str(extra.get("x-daskhps-type") or _type_text(info))
    meaning = " ".join((info.description or "").split())
    default = extra.get("x-daskhps-default")
    return (typ, meaning) if default is None else (typ, meaning, str(default))


def _type_text(info: FieldInfo) -> str:
    """``int >= 1 or null``, ``float in [0, 1)``, ```lru` or `lfu```: the declaration in words."""
    t = info.annotation
    nullable = type(None) in union_members(t)
    members = [m for m in union_members(t) if m is not type(None)] or [t]
    choices = [c for m in members for c in literal_args(m)]
    if choices and bool in members:  # true, false or a word (cluster.gpu)
        choices = [False, True, *choices]
    if choices:
        words = [f"`{_yaml(c)}`" for c in choices] + (["null"] if nullable else [])
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
    base = type_name(members[0] if len(members) == 1 else t)
    if nullable:
        base = base.replace(" or null", "")
    bounds = {type(m).__name__: m for m in info.metadata}
    lo = next((("[", b.ge) for b in [bounds.get("Ge")] if b is not None), None) or next(
        (("(", b.gt) for b in [bounds.get("Gt")] if b is not None), None
    )
    hi = next(((")", b.lt) for b in [bounds.get("Lt")] if b is not None), None) or next(
        (("]", b.le) for b in [bounds.get("Le")] if b is not None), None
    )
    if lo and hi:
        base += f" in {lo[0]}{plain_number(lo[1])}, {plain_number(hi[1])}{hi[0]}"
    elif lo:
        base += f" {'>=' if lo[0] == '[' else '>'} {plain_number(lo[1])}"
    elif hi:
        base += f" {'<' if hi[0] == ')' else '<='} {plain_number(hi[1])}"
    return base + (" or null" if nullable else "")


def _yaml(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        path = f"{prefix}.{k}" if prefix else k
        out[path] = v
        if isinstance(v, dict):
            out.update(_flatten(v, path))
    return out


def defaults() -> dict[str, Any]:
    """``{dotted key: value}`` of the minimal configs, resolved by the loader."""
    out: dict[str, Any] = {}
    for sample in _SAMPLES:
        for k, v in _flatten(RunConfig.from_dict(sample).to_dict()).items():
            out.setdefault(k, v)
    return out


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "`{}`" if not value else "—"  # a section: its keys follow
    return f"`{json.dumps(value)}`".replace('"', "")


def _leaves(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and prefix:
            out.append(path)  # a sub-mapping gets its own row, then its keys
        if isinstance(v, dict):
            out.extend(_leaves(v, path))
        elif prefix:
            out.append(path)
    return out


def _entry_default(key: str, section: str, vals: dict[str, Any]) -> str:
    """An entry key's default: required, the other section's value it takes, or its own."""
    info = declared(key)
    assert info is not None  # a list section is declared
    other = f"{LISTS[section]}.{key.partition('.')[2]}"
    if info.is_required():
        return "required"
    return f"`{other}`" if other in vals else _show(info.default)


def render() -> str:
    """The reference tables, one per section, as Markdown."""
    vals = defaults()
    tree = key_tree()
    lines: list[str] = []
    for section in tree:
        lines += [f"### `{section}`", "", _SECTION_TEXT[section], ""]
        lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for key in _leaves({section: tree[section]}):
            if key == section:
                continue
            typ, meaning, *explicit = describe(key)
            if explicit:
                default = explicit[0]
            elif section in LISTS:
                default = _entry_default(key, section, vals)
            elif key in vals:
                default = _show(vals[key])
            else:
                default = "null"
            lines.append(f"| `{key}` | {typ} | {default} | {meaning} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_schema() -> str:
    """The keys of a schema file (``data.schema`` inline, or a file it names), from the
    schema's declarations, as Markdown; a dense or categorical field is a column name or such
    a mapping."""
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for prefix, model in (
        ("", Schema),
        ("dense[]", DenseField),
        ("categorical[]", CategoricalField),
    ):
        for name in model.key_names():
            info = model.model_fields[name]
            key = f"{prefix}.{name}" if prefix else name
            if name in ("dense", "categorical"):
                typ, default = "list", "—"  # of the fields below
            elif options_in(info.annotation) is not None:
                typ, default = "mapping", "—"  # dense[]'s keys but name
            else:
                typ = _type_text(info)
                default = "required" if info.is_required() else _show(info.default)
            meaning = " ".join((info.description or "").split())
            lines.append(f"| `{key}` | {typ} | {default} | {meaning} |")
    return "\n".join(lines) + "\n"


START, END = "<!-- reference:start -->", "<!-- reference:end -->"
SCHEMA_START, SCHEMA_END = "<!-- schema-reference:start -->", "<!-- schema-reference:end -->"


def _between(text: str, start: str, end: str, block: str) -> str:
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    return f"{head}{start}\n\n{block}\n{end}{tail}"


def update_document(path: str | Path) -> bool:
    """Rewrite the references between the markers of ``path``; True when it changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    new = _between(text, START, END, render())
    new = _between(new, SCHEMA_START, SCHEMA_END, render_schema())
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    changed = update_document(sys.argv[1] if len(sys.argv) > 1 else "docs/configuration.md")
    print("updated" if changed else "up to date")

"""The JSON schema of a run config, for editors: ``daskhps config --schema``.

Generated from the same declarations the loader validates with (the sections' pydantic
models), so it cannot drift from them. The ``model`` section's options depend on the model
class and are left open. The loader stays the authority: its messages say more (the file's
line, a did-you-mean), and it reads ``1e6`` as the int it names.
"""

from __future__ import annotations

import json
from typing import Any

from daskhps.config._keys import LISTS, SECTIONS, section_models
from daskhps.config.reference import DOCS

__all__ = ["json_schema", "render_json_schema"]

# pydantic leaves a bound on ``int | None`` under its own name; JSON Schema's words for them.
_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}

_MODEL = {
    "type": "object",
    "description": "The dense model (`daskhps.models`).",
    "properties": {
        "name": {
            "type": "string",
            "description": DOCS["model.name"][1],
            "default": "dlrm",
        },
        "options": {
            "type": ["object", "null"],
            "description": DOCS["model.options"][1],
        },
    },
    "additionalProperties": False,
}


def _json_words(node: Any) -> Any:
    if isinstance(node, dict):
        return {_BOUNDS.get(k, k): _json_words(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_json_words(v) for v in node]
    return node


def json_schema() -> dict[str, Any]:
    """The run config's JSON schema (draft 2020-12)."""
    defs: dict[str, Any] = {}
    properties: dict[str, Any] = {}
    models = section_models()
    for name in SECTIONS:
        if name == "model":
            properties[name] = _MODEL
            continue
        schema = models[name].model_json_schema(ref_template="#/$defs/{model}")
        defs.update(schema.pop("$defs", {}))
        if name in LISTS:  # a list of such mappings
            schema = {"type": "array", "items": schema, "description": schema.get("description")}
        properties[name] = {"anyOf": [schema, {"type": "null"}]}  # null: every default
    return _json_words(
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "daskhps run config",
            "type": "object",
            "properties": properties,
            "additionalProperties": False,
            "$defs": defs,
        }
    )


def render_json_schema() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"

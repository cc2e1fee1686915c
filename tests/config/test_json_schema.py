"""``daskhps config --schema``: the JSON schema editors use, generated from the declarations,
against the loader: the shipped configs pass both, configs the loader refuses fail both, and
every key the loader knows is in the schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from daskhps._yaml import load_yaml_with_lines
from daskhps.cli import main
from daskhps.config import RunConfig
from daskhps.config._keys import all_keys, free_form
from daskhps.config.json_schema import json_schema
from daskhps.errors import ConfigError
from daskhps.models import BUILTIN_MODELS

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_pass(validator: jsonschema.Draft202012Validator, path: Path) -> None:
    raw, _ = load_yaml_with_lines(path)
    assert [e.message for e in validator.iter_errors(raw)] == []


def test_a_resolved_config_passes(validator: jsonschema.Draft202012Validator) -> None:
    cfg = RunConfig.from_dict({"data": {"generate": {}, "holdout": {"fraction": 0.1}}})
    assert [e.message for e in validator.iter_errors(cfg.to_dict())] == []


BAD: list[dict[str, Any]] = [
    {"tabel": {}},
    {"data": {"generate": {}}, "table": {"dim": 0}},
    {"data": {"generate": {}}, "table": {"dimm": 8}},
    {"data": {"generate": {}}, "table": {"tiers": {"policy": "fifo"}}},
    {"data": {"generate": {}}, "table": {"optimizer": {"beta1": 1.0}}},
    {"data": {"generate": {}}, "run": {"quiet": "yes"}},
    {"data": {"generate": {"ctr": 2}}},
    {"data": {"generate": {}}, "cluster": {"dist_backend": "mpi"}},
    {"data": {"generate": {}}, "eval": {"metrics": ["auc", "f1"]}},
]


@pytest.mark.parametrize("raw", BAD, ids=[json.dumps(b) for b in BAD])
def test_what_the_loader_refuses_the_schema_refuses(
    validator: jsonschema.Draft202012Validator, raw: dict[str, Any]
) -> None:
    with pytest.raises(ConfigError):
        RunConfig.from_dict(raw)
    assert list(validator.iter_errors(raw))


def _has(schema: dict[str, Any], node: dict[str, Any], key: str) -> bool:
    for part in key.split("."):
        node = _props(schema, node)
        if part not in node:
            return False
        node = node[part]
    return True


def _props(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """The properties of a schema node, through ``$ref``, ``anyOf`` and a list's items."""
    if "$ref" in node:
        node = schema["$defs"][node["$ref"].rpartition("/")[2]]
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        return _props(schema, node["items"])
    for option in node.get("anyOf", []):
        found = _props(schema, option)
        if found:
            return found
    return node.get("properties", {})


def test_every_key_is_in_the_schema() -> None:
    schema = json_schema()
    missing = [k for k in all_keys() if not free_form(k) and not _has(schema, schema, k)]
    assert missing == []


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_every_built_in_model_is_named_and_valid(
    validator: jsonschema.Draft202012Validator, name: str
) -> None:
    # The reference (docs/configuration.md) and the schema say the same, read from the registry.
    model = json_schema()["properties"]["model"]
    assert f"`{name}`" in model["properties"]["name"]["description"]
    raw = {"data": {"generate": {}}, "model": {"name": name, "options": {"dropout": 0.1}}}
    assert [e.message for e in validator.iter_errors(raw)] == []
    assert RunConfig.from_dict(raw).model.name == name


def test_config_command_prints_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json_schema()

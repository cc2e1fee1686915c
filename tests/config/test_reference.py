"""docs/configuration.md against the code: every key documented, every documented key real,
defaults as the loader resolves them, dataclass fields and key lists in agreement."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from daskhps.config import (
    ClusterConfig,
    DataConfig,
    DenseOptimizerConfig,
    DeviceTierConfig,
    EvalConfig,
    GenerateConfig,
    HoldoutConfig,
    HostTierConfig,
    PassesConfig,
    RunConfig,
    RunSection,
    TableConfig,
    TiersConfig,
)
from daskhps.config._keys import LISTS, SECTIONS, all_keys
from daskhps.config.reference import DOCS, END, START, defaults, describe, render
from daskhps.options import Options

DOC = Path(__file__).parents[2] / "docs" / "configuration.md"


def _documented() -> dict[str, str]:
    """``{key: default column}`` of the reference tables in the document."""
    block = DOC.read_text().partition(START)[2].partition(END)[0]
    rows = re.findall(r"^\| `([\w.]+)` \| [^|]+ \| ([^|]+) \|", block, flags=re.M)
    return {k: d.strip() for k, d in rows}


def _yaml_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return ", ".join(map(_yaml_text, value))
    return str(value)


def test_document_is_current() -> None:
    block = DOC.read_text().partition(START)[2].partition(END)[0]
    assert block.strip() == render().strip(), (
        "docs/configuration.md is stale: python -m daskhps.config.reference docs/configuration.md"
    )


def test_every_key_documented_and_every_documented_key_real() -> None:
    keys = {k for k in all_keys() if "." in k}
    assert set(_documented()) == keys
    for key in keys:  # declared on a field (its docstring), or in DOCS until its section is
        typ, meaning, *_ = describe(key)
        assert typ and meaning, key
    assert set(DOCS) <= keys


def test_documented_defaults_are_the_loaders() -> None:
    vals = defaults()
    for key, shown in _documented().items():
        if key in vals and not isinstance(vals[key], dict) and len(describe(key)) == 2:
            literal = shown.strip("`").replace("[", "").replace("]", "")
            value = vals[key]
            assert literal == _yaml_text(value), key


def test_every_dataclass_field_is_a_key() -> None:
    # Each section's YAML keys are its fields (declared sections: by construction).
    spread: dict[type, tuple[set[str], set[str]]] = {}
    for cls in (
        RunSection, DataConfig, GenerateConfig, HoldoutConfig, PassesConfig, TableConfig,
        TiersConfig, DeviceTierConfig, HostTierConfig, DenseOptimizerConfig, ClusterConfig,
        EvalConfig,
    ):  # fmt: skip
        if issubclass(cls, Options):  # declared once: its keys are its fields
            assert cls.key_names() == tuple(cls.model_fields), cls.__name__
            continue
        names = {f.name for f in dataclasses.fields(cls)}
        inner, flat = spread.get(cls, (set(), set()))
        assert names - inner | flat == set(cls.KEYS), cls.__name__
    # where the config came from, not what it is
    fields = {f.name for f in dataclasses.fields(RunConfig)} - {"source", "origins"}
    assert fields == set(SECTIONS)


def test_storage_options_are_never_written_nor_part_of_the_run() -> None:
    secret = {"s3": {"endpoint_url": "http://127.0.0.1:9000", "secret": "hunter2"}}
    base = {"data": {"generate": {}}}
    cfg = RunConfig.from_dict({**base, "storage": {"options": secret}})
    assert cfg.storage.options == secret
    assert "storage" not in cfg.to_dict() and "hunter2" not in cfg.to_yaml()
    assert cfg == RunConfig.from_dict(base)  # the same run, reached otherwise
    assert "hunter2" not in repr(cfg) and "hunter2" not in str(cfg.storage)
    from daskhps.distributed._worker_setup import WorkerSetup

    assert "hunter2" not in repr(WorkerSetup(False, secret))


# storage.options is left out of to_dict (config.yaml) on purpose: see the test above.
@pytest.mark.parametrize("section", [s for s in SECTIONS if s != "storage"])
def test_to_dict_keys_are_documented(section: str) -> None:
    tables = [{"name": "ids", "features": ["C1"]}]  # written only when there are some
    cfg = RunConfig.from_dict(
        {"data": {"generate": {}, "holdout": {"fraction": 0.1}}, "tables": tables}
    )
    keys = {k for k in all_keys() if k.startswith(section)}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            path = f"{prefix}.{k}"
            assert path in keys, path
            if isinstance(v, dict) and path not in ("model.options", "data.schema"):
                walk(v, path)

    written = cfg.to_dict()[section]
    for entry in written if section in LISTS else [written]:  # a list section: each entry
        walk(entry, section)


def test_schema_reference_is_current_and_lists_every_schema_key() -> None:
    from daskhps.config.reference import SCHEMA_END, SCHEMA_START, render_schema
    from daskhps.data.schema import CategoricalField, DenseField, Schema

    block = DOC.read_text().partition(SCHEMA_START)[2].partition(SCHEMA_END)[0]
    assert block.strip() == render_schema().strip(), "python -m daskhps.config.reference"
    rows = set(re.findall(r"^\| `([\w.\[\]]+)` \|", block, flags=re.M))
    want = {*Schema.model_fields}
    want |= {f"dense[].{k}" for k in DenseField.model_fields}
    want |= {f"categorical[].{k}" for k in CategoricalField.model_fields}
    assert rows == want

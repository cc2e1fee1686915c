"""Schemas from YAML: the builtin Criteo schema, precise errors, every file in configs/schemas."""

from __future__ import annotations

from pathlib import Path

import pytest

from daskhps.data import DataSource, Schema, criteo_schema, load_schema
from daskhps.data.badrows import BadRowPolicy
from daskhps.errors import ConfigError

SCHEMAS = sorted((Path(__file__).resolve().parents[2] / "configs" / "schemas").glob("*.yaml"))


def test_criteo_builtin() -> None:
    s = criteo_schema()
    assert s.columns[0] == "label" and len(s.columns) == 40
    assert s.dense_names == tuple(f"I{i}" for i in range(1, 14))
    assert s.categorical_names == tuple(f"C{i}" for i in range(1, 27))
    assert Schema.from_dict(s.to_dict()) == s


def test_schema_files_exist() -> None:
    assert {p.stem for p in SCHEMAS} >= {"criteo", "avazu"}


@pytest.mark.parametrize("path", SCHEMAS, ids=lambda p: p.name)
def test_every_schema_file_loads(path: Path) -> None:
    s = load_schema(path)
    assert Schema.from_dict(s.to_dict()) == s
    assert s.categorical or s.dense
    if path.stem == "criteo":
        assert s == criteo_schema()


BASE = {
    "name": "t",
    "columns": ["y", "a", "b"],
    "label": "y",
    "dense": ["a"],
    "categorical": ["b"],
}


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"colour": 1}, r"f\.yaml: colour: unknown key; did you mean 'columns'\? allowed keys:"),
        ({"header": "yes"}, r"f\.yaml: header: expected bool, got str"),
        ({"format": "xls"}, r"f\.yaml: format: 'xls' is not allowed; choose one of"),
        ({"dense": [{"name": "a", "transform": "sqrt"}]}, r"dense\[0\]\.transform"),
        ({"dense": [{"name": "a", "scale": 2}]}, r"dense\[0\]\.scale: unknown key"),
        ({"categorical": [{"name": "b", "pooling": "max"}]}, r"categorical\[0\]\.pooling"),
        ({"categorical": ["zz"]}, r"'zz' is not one of the columns"),
        ({"dense": ["b"]}, r"used twice"),
        ({"columns": []}, r"columns: required"),
        ({"delimiter": "::"}, r"one character"),
        ({"label": 3}, r"label: expected str"),
    ],
)
def test_errors_name_file_key_and_allowed(patch: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Schema.from_dict({**BASE, **patch}, source="f.yaml")


def test_ranges_defaults_and_multi_hot() -> None:
    s = Schema.from_dict(
        {
            "name": "t",
            "format": "csv",
            "header": True,
            "label": "click",
            "dense_defaults": {"transform": "identity", "clip_min": None, "fill": -1},
            "dense": ["x{1..3}", {"name": "y", "transform": "log1p"}],
            "categorical": [{"name": "tags", "separator": "|", "pooling": "mean"}, "c"],
        }
    )
    assert s.dense_names == ("x1", "x2", "x3", "y")
    assert s.dense[0].transform == "identity" and s.dense[0].fill == -1.0
    assert s.dense[3].transform == "log1p"
    assert s.categorical[0].multi_hot and not s.categorical[1].multi_hot
    assert s.delimiter == ","


def test_load_schema_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file and not a builtin"):
        load_schema(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:2: not valid YAML"):
        load_schema(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_schema(bad)


def test_data_source_from_dict(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("name: t\ncolumns: [y, a]\nlabel: y\ncategorical: [a]\n")
    src = DataSource.from_dict(
        {
            "paths": "logs/day=*/part-*",
            "schema": "s.yaml",
            "days": ["2024-01-01", "2024-01-07"],
            "bad_rows": {"action": "fail"},
        },
        source=str(tmp_path / "run.yaml"),
    )
    assert src.schema.name == "t" and src.bad_rows == BadRowPolicy(action="fail")
    assert src.days == ("2024-01-01", "2024-01-07")
    with pytest.raises(ConfigError, match=r"run.yaml: data.days: expected \[YYYY-MM-DD"):
        DataSource.from_dict({"paths": "x", "days": ["monday"]}, "run.yaml", "data")
    with pytest.raises(ConfigError, match=r"bad_rows.action: 'ignore' is not allowed"):
        DataSource.from_dict({"paths": "x", "bad_rows": "ignore"}, "run.yaml")


def test_file_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: t\nheader: true\nlabel: y\ndense:\n  - a\n  - {name: b, clip_min: 3, clip_max: 1}\n"
    )
    with pytest.raises(ConfigError, match=r"s\.yaml:6: dense\[1\]\.clip_max: must be >= clip_min"):
        load_schema(path)
    path.write_text("name: t\nheader: true\nlabel: y\ndense_defaults: {fil: 1}\ndense: [a]\n")
    with pytest.raises(ConfigError, match=r"s\.yaml:4: dense_defaults\.fil: unknown key; did you"):
        load_schema(path)


def test_dense_defaults_fill_fields_that_do_not_say_their_own() -> None:
    s = Schema.from_dict(
        {
            **BASE,
            "columns": ["y", "a", "b", "c"],
            "dense": ["a", {"name": "c", "fill": 1}],
            "dense_defaults": {"fill": 2, "transform": "identity"},
        }
    )
    assert [(f.fill, f.transform) for f in s.dense] == [(2.0, "identity"), (1.0, "identity")]
    assert Schema.from_dict(s.to_dict()) == s and "dense_defaults" not in s.to_dict()


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"dense": [3]}, r"dense\[0\]: expected a column name or a mapping with keys name, "),
        (
            {"categorical": [{"name": "b", "separator": ""}]},
            r"categorical\[0\]\.separator: must not",
        ),
        ({"categorical": ["C{3..1}"]}, r"categorical: empty range 'C\{3\.\.1\}'"),
        ({"dense": ["label"], "columns": ["y", "label", "b"]}, r"dense\[0\]: a feature may not"),
    ],
)
def test_field_errors_name_the_field(patch: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Schema.from_dict({**BASE, **patch}, source="f.yaml")

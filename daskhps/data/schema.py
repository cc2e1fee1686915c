"""Click-log schemas: which column is the label, which are dense, which categorical.

A schema is a frozen dataclass built from YAML (or a dict) by :meth:`Schema.from_dict`; users
describe a new click log in a file and write no code::

    name: avazu
    format: csv            # tsv | csv | parquet
    header: true           # text files: first line names the columns
    label: click           # values must be 0 or 1
    dense: []              # names, or mappings {name, transform, clip_min, clip_max, fill}
    categorical: [hour, site_id, app_id, device_model, "C{14..21}"]
    # a multi-hot column: {name: tags, separator: "|", pooling: mean}

``"C{14..21}"`` expands to ``C14, C15, ..., C21``. Every parsed frame has the columns
``label`` (float32), one float32 column per dense field and one int64 key column per
categorical field (a list of int64 keys for a multi-hot field), in schema order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daskhps.data._validate import check_keys, get, load_yaml
from daskhps.errors import ConfigError

__all__ = [
    "LABEL",
    "CategoricalField",
    "DenseField",
    "Schema",
    "criteo_schema",
    "load_schema",
    "looks_like_file",
]

LABEL = "label"
FORMATS = ("tsv", "csv", "parquet")
TRANSFORMS = ("log1p", "identity")
POOLINGS = ("sum", "mean")
_RANGE = re.compile(r"^(.*)\{(\d+)\.\.(\d+)\}(.*)$")


def _expand(names: list[Any], source: str, key: str) -> list[Any]:
    out: list[Any] = []
    for item in names:
        m = _RANGE.match(item) if isinstance(item, str) else None
        if m:
            lo, hi = int(m.group(2)), int(m.group(3))
            if hi < lo:
                raise ConfigError(f"{source}: {key}: empty range {item!r}")
            out.extend(f"{m.group(1)}{i}{m.group(4)}" for i in range(lo, hi + 1))
        else:
            out.append(item)
    return out


@dataclass(frozen=True)
class DenseField:
    """A numeric feature: ``clip -> transform``, and ``fill`` where the value is missing.

    ``log1p`` of a value clipped at ``clip_min=0`` is the usual Criteo treatment of counts.
    """

    name: str
    transform: str = "log1p"
    clip_min: float | None = 0.0
    clip_max: float | None = None
    fill: float = 0.0

    _KEYS = ("name", "transform", "clip_min", "clip_max", "fill")

    @classmethod
    def from_dict(
        cls, d: Any, source: str = "<dict>", prefix: str = "dense", defaults: Any = None
    ) -> DenseField:
        if isinstance(d, str):
            d = {"name": d}
        d = {**(defaults or {}), **check_keys(d, cls._KEYS, source, prefix)}
        f = cls(
            name=get(d, "name", str, source, prefix),
            transform=get(d, "transform", str, source, prefix, "log1p", TRANSFORMS),
            clip_min=get(d, "clip_min", (float, type(None)), source, prefix, 0.0),
            clip_max=get(d, "clip_max", (float, type(None)), source, prefix, None),
            fill=get(d, "fill", float, source, prefix, 0.0),
        )
        if f.clip_min is not None and f.clip_max is not None and f.clip_max < f.clip_min:
            raise ConfigError(f"{source}: {prefix}.clip_max: must be >= clip_min")
        return f


@dataclass(frozen=True)
class CategoricalField:
    """A categorical feature hashed to int64 keys; ``separator`` makes it multi-hot."""

    name: str
    separator: str | None = None
    pooling: str = "sum"

    _KEYS = ("name", "separator", "pooling")

    @property
    def multi_hot(self) -> bool:
        return self.separator is not None

    @classmethod
    def from_dict(
        cls, d: Any, source: str = "<dict>", prefix: str = "categorical"
    ) -> CategoricalField:
        if isinstance(d, str):
            d = {"name": d}
        d = check_keys(d, cls._KEYS, source, prefix)
        sep = get(d, "separator", (str, type(None)), source, prefix, None)
        if sep == "":
            raise ConfigError(f"{source}: {prefix}.separator: must not be empty")
        return cls(
            name=get(d, "name", str, source, prefix),
            separator=sep,
            pooling=get(d, "pooling", str, source, prefix, "sum", POOLINGS),
        )


@dataclass(frozen=True)
class Schema:
    """How to read one kind of click log.

    ``columns`` lists every column of a text file in order; it may be empty when the files
    have a header line or are parquet (the names then come from the files). Columns that are
    neither label, dense nor categorical are ignored.
    """

    name: str
    label: str
    dense: tuple[DenseField, ...] = ()
    categorical: tuple[CategoricalField, ...] = ()
    format: str = "tsv"
    header: bool = False
    columns: tuple[str, ...] = ()
    delimiter: str = "\t"
    source: str = field(default="<dict>", compare=False)

    _KEYS = (
        "name",
        "format",
        "header",
        "columns",
        "delimiter",
        "label",
        "dense",
        "dense_defaults",
        "categorical",
    )

    @property
    def dense_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.dense)

    @property
    def categorical_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.categorical)

    @property
    def used_columns(self) -> tuple[str, ...]:
        """The file columns the reader needs: label, dense, categorical."""
        return (self.label, *self.dense_names, *self.categorical_names)

    @property
    def feature_columns(self) -> tuple[str, ...]:
        """The file columns of the features: what a log without the label column holds."""
        return (*self.dense_names, *self.categorical_names)

    @property
    def output_columns(self) -> tuple[str, ...]:
        """Columns of a parsed frame, in order."""
        return (LABEL, *self.dense_names, *self.categorical_names)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "<dict>") -> Schema:
        d = check_keys(d, cls._KEYS, source)
        fmt = get(d, "format", str, source, default="tsv", choices=FORMATS)
        columns = _expand(get(d, "columns", list, source, default=[]), source, "columns")
        for i, c in enumerate(columns):
            if not isinstance(c, str):
                raise ConfigError(f"{source}: columns[{i}]: expected a column name, got {c!r}")
        defaults = get(d, "dense_defaults", dict, source, default={})
        check_keys(defaults, DenseField._KEYS[1:], source, "dense_defaults")
        dense_raw = _expand(get(d, "dense", list, source, default=[]), source, "dense")
        cat_raw = _expand(get(d, "categorical", list, source, default=[]), source, "categorical")
        schema = cls(
            name=get(d, "name", str, source),
            format=fmt,
            header=get(d, "header", bool, source, default=False),
            columns=tuple(columns),
            delimiter=get(d, "delimiter", str, source, default="," if fmt == "csv" else "\t"),
            label=get(d, "label", str, source),
            dense=tuple(
                DenseField.from_dict(x, source, f"dense[{i}]", defaults)
                for i, x in enumerate(dense_raw)
            ),
            categorical=tuple(
                CategoricalField.from_dict(x, source, f"categorical[{i}]")
                for i, x in enumerate(cat_raw)
            ),
            source=source,
        )
        schema._check()
        return schema

    def _check(self) -> None:
        src = self.source
        if len(self.delimiter) != 1:
            raise ConfigError(f"{src}: delimiter: must be one character, got {self.delimiter!r}")
        if self.format != "parquet" and not self.header and not self.columns:
            raise ConfigError(
                f"{src}: columns: required for {self.format} files without a header line"
            )
        if not self.categorical and not self.dense:
            raise ConfigError(f"{src}: dense/categorical: the schema has no features")
        seen: set[str] = set()
        for name in self.used_columns:
            if name in seen:
                raise ConfigError(f"{src}: column {name!r} is used twice (label/dense/categorical)")
            seen.add(name)
        features = (*self.dense_names, *self.categorical_names)
        if LABEL in features:
            raise ConfigError(f"{src}: a feature may not be called {LABEL!r}; rename the column")
        if self.columns:
            if len(set(self.columns)) != len(self.columns):
                raise ConfigError(f"{src}: columns: names must be unique")
            missing = [c for c in self.used_columns if c not in self.columns]
            if missing:
                raise ConfigError(
                    f"{src}: {missing[0]!r} is not one of the columns "
                    f"({', '.join(self.columns[:6])}, ...)"
                )

    def to_dict(self) -> dict[str, Any]:
        """The schema as a plain mapping that :meth:`from_dict` accepts."""
        return {
            "name": self.name,
            "format": self.format,
            "header": self.header,
            "columns": list(self.columns),
            "delimiter": self.delimiter,
            "label": self.label,
            "dense": [{k: getattr(f, k) for k in DenseField._KEYS} for f in self.dense],
            "categorical": [
                {k: getattr(f, k) for k in CategoricalField._KEYS} for f in self.categorical
            ],
        }


def criteo_schema() -> Schema:
    """Criteo's display-ads log: label, I1..I13 (integers), C1..C26 (8 hex digits), TSV."""
    return Schema.from_dict(
        {
            "name": "criteo",
            "format": "tsv",
            "columns": ["label", "I{1..13}", "C{1..26}"],
            "label": "label",
            "dense": ["I{1..13}"],
            "categorical": ["C{1..26}"],
        },
        source="<builtin criteo>",
    )


BUILTIN = {"criteo": criteo_schema}


def looks_like_file(value: str) -> bool:
    """A schema value names a file when it ends in ``.yaml``/``.yml`` or holds a separator."""
    return value.endswith((".yaml", ".yml")) or "/" in value or "\\" in value


def load_schema(
    spec: str | Path | Mapping[str, Any] | Schema, base: str | Path | None = None
) -> Schema:
    """A schema from a builtin name (``criteo``), a YAML file, a mapping or a Schema.

    A builtin name stays the builtin unless it :func:`looks_like_file`: a ``criteo/`` folder
    of logs beside the config must not shadow the ``criteo`` schema. Any other string is a
    file, looked up in ``base`` (the config's folder) first, then from the current folder.
    """
    if isinstance(spec, Schema):
        return spec
    if isinstance(spec, Mapping):
        return Schema.from_dict(spec)
    if isinstance(spec, str) and spec in BUILTIN and not looks_like_file(spec):
        return BUILTIN[spec]()
    path = Path(spec)
    if base is not None and not path.is_absolute() and (Path(base) / path).exists():
        path = Path(base) / path
    if not path.exists():
        raise ConfigError(
            f"schema {str(spec)!r}: no such file and not a builtin schema "
            f"(builtins: {', '.join(BUILTIN)}; a file ends in .yaml or .yml, or holds a '/')"
        )
    return Schema.from_dict(load_yaml(path), source=str(path))

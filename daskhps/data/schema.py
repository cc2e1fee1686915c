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

import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from daskhps._yaml import load_yaml_with_lines
from daskhps.data.keyspace import FieldKeys
from daskhps.errors import ConfigError
from daskhps.options import Ctx, Options, Problem, Seq, validate

__all__ = [
    "LABEL",
    "CategoricalField",
    "DenseField",
    "DenseTreatment",
    "Schema",
    "criteo_schema",
    "expand_ranges",
    "load_schema",
    "looks_like_file",
    "schema_at",
]

LABEL = "label"
_RANGE = re.compile(r"^(.*)\{(\d+)\.\.(\d+)\}(.*)$")


def expand_ranges(names: Any, key: str) -> Any:
    """``"C{1..3}"`` in a list as ``C1, C2, C3``; anything else as it is (the field checks it)."""
    if not isinstance(names, list):
        return names
    out: list[Any] = []
    for item in names:
        m = _RANGE.match(item) if isinstance(item, str) else None
        if m:
            lo, hi = int(m.group(2)), int(m.group(3))
            if hi < lo:
                raise Problem(key, f"empty range {item!r}")
            out.extend(f"{m.group(1)}{i}{m.group(4)}" for i in range(lo, hi + 1))
        else:
            out.append(item)
    return out


def _named(item: Any) -> Any:
    """A field written as its column name is the field of that name with every default."""
    return {"name": item} if isinstance(item, str) else item


def _a_field(cls: type[Options], data: Any) -> Any:
    """A field's entry is its column name or a mapping of its keys (the fields' validator)."""
    if not isinstance(data, (str, Mapping)):
        keys = ", ".join(cls.key_names())
        raise Problem("", f"expected a column name or a mapping with keys {keys}; got {data!r}")
    return _named(data)


class DenseTreatment(Options):
    """What is done to a numeric value: ``clip -> transform``, and ``fill`` where it is missing
    (``dense_defaults`` sets it for every dense field)."""

    transform: Literal["log1p", "identity"] = "log1p"
    """log1p of a value clipped at 0 is the usual treatment of counts."""
    clip_min: float | None = 0.0
    """Values below are raised to it; null: no lower clip."""
    clip_max: float | None = None
    """Values above are lowered to it; null: no upper clip."""
    fill: float = 0.0
    """The value of a missing field."""

    @model_validator(mode="after")
    def _clip_range(self) -> DenseTreatment:
        if (
            self.clip_min is not None
            and self.clip_max is not None
            and self.clip_max < self.clip_min
        ):
            raise Problem("clip_max", "must be >= clip_min")
        return self


class DenseField(DenseTreatment):
    """A numeric feature: a column and its treatment."""

    name: str
    """The column."""

    @model_validator(mode="before")
    @classmethod
    def _a_name(cls, data: Any) -> Any:
        return _a_field(cls, data)

    @classmethod
    def key_names(cls) -> tuple[str, ...]:
        return ("name", *DenseTreatment.model_fields)  # the column first, as users write it

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.key_names()}


class CategoricalField(Options):
    """A categorical feature hashed to int64 keys; ``separator`` makes it multi-hot."""

    name: str
    """The column."""
    separator: str | None = Field(None, min_length=1)
    """Splits a multi-hot value into keys; null: one key a row."""
    pooling: Literal["sum", "mean"] = "sum"
    """How a multi-hot field's embeddings are combined."""

    @model_validator(mode="before")
    @classmethod
    def _a_name(cls, data: Any) -> Any:
        return _a_field(cls, data)

    @property
    def multi_hot(self) -> bool:
        return self.separator is not None


class Schema(Options):
    """How to read one kind of click log.

    ``columns`` lists every column of a text file in order; it may be empty when the files
    have a header line or are parquet (the names then come from the files). Columns that are
    neither label, dense nor categorical are ignored.
    """

    name: str
    """What the logs are called."""
    format: Literal["tsv", "csv", "parquet"] = "tsv"
    """How the files are written."""
    header: bool = False
    """Text files: the first line names the columns."""
    columns: Seq[str] = ()
    """Every column of a text file in order; `C{1..26}` is C1 .. C26."""
    delimiter: str = Field("\t", min_length=1, max_length=1)
    """One character; csv: `,`."""
    label: str
    """The column of 0/1 clicks."""
    dense_defaults: DenseTreatment = Field(DenseTreatment(), exclude=True)
    """The treatment of every dense field that does not say its own."""
    dense: Seq[DenseField] = ()
    """Numeric columns: names, or mappings with their treatment."""
    categorical: Seq[CategoricalField] = ()
    """Categorical columns: names, or mappings with a multi-hot separator."""

    # How the categorical values become keys: not part of how a log is read, but of the run
    # the schema is used in (its tables: daskhps.data.keyspace); set by keyed().
    _field_keys: FieldKeys | None = PrivateAttr(None)

    @model_validator(mode="before")
    @classmethod
    def _written_forms(cls, data: Any) -> Any:
        # Ranges expand, csv's delimiter is a comma, and dense_defaults fill every dense field
        # (declared before dense, so a bad default is reported at dense_defaults).
        if not isinstance(data, Mapping):
            return data
        d = dict(data)
        for key in ("columns", "dense", "categorical"):
            if key in d:
                d[key] = expand_ranges(d[key], key)
        if d.get("format") == "csv" and "delimiter" not in d:
            d["delimiter"] = ","
        defaults = d.get("dense_defaults")
        if isinstance(defaults, Mapping) and isinstance(d.get("dense"), list):
            d["dense"] = [
                {**defaults, **f} if isinstance(f, Mapping) else f
                for f in (_named(x) for x in d["dense"])
            ]
        return d

    @model_validator(mode="after")
    def _columns_add_up(self) -> Schema:
        if self.format != "parquet" and not self.header and not self.columns:
            raise Problem("columns", f"required for {self.format} files without a header line")
        if not self.categorical and not self.dense:
            raise Problem("categorical", "the schema has no features; list dense or categorical")
        used = [
            ("label", self.label),
            *((f"dense[{i}]", f.name) for i, f in enumerate(self.dense)),
            *((f"categorical[{i}]", f.name) for i, f in enumerate(self.categorical)),
        ]
        seen: set[str] = set()
        for key, name in used:
            if name in seen:
                raise Problem(key, f"column {name!r} is used twice (label/dense/categorical)")
            seen.add(name)
            if name == LABEL and key != "label":
                raise Problem(key, f"a feature may not be called {LABEL!r}; rename the column")
        if len(set(self.columns)) != len(self.columns):
            raise Problem("columns", "names must be unique")
        if self.columns:
            for key, name in used:
                if name not in self.columns:
                    raise Problem(
                        key,
                        f"{name!r} is not one of the columns ({', '.join(self.columns[:6])}, ...)",
                    )
        return self

    def __eq__(self, other: object) -> bool:
        # dense_defaults is how a file is written, not what it reads: it is in every dense field.
        if not isinstance(other, Schema):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((self.name, self.label, self.dense_names, self.categorical_names))

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

    @property
    def field_keys(self) -> FieldKeys:
        """How each categorical field's values become keys: by default hashed with the
        field's own salt, untagged (one table)."""
        if self._field_keys is not None:
            return self._field_keys
        return FieldKeys(self.categorical_names)

    def keyed(self, keys: FieldKeys) -> Schema:
        """This schema, hashing its categorical values as ``keys`` says (a run's tables)."""
        if len(keys.salts) != len(self.categorical):
            raise ValueError(f"{len(keys.salts)} key rules for {len(self.categorical)} fields")
        out = self.model_copy()
        out._field_keys = keys
        return out

    def to_dict(self) -> dict[str, Any]:
        """The schema as a plain mapping that :meth:`from_dict` reads back to an equal one."""
        out = super().to_dict()
        del out["dense_defaults"]
        return out


@functools.cache
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
    data, lines = load_yaml_with_lines(path)
    return validate(Schema, data, Ctx(str(path), lines), "")


def schema_at(spec: Any, ctx: Ctx, key: str) -> Schema:
    """The schema a config's ``key`` names (a builtin, a file or a mapping); its errors name
    ``key`` of ``ctx``'s file, and a schema file's own errors its file and line after that.

    A schema file is looked up beside the config file first, then from the current folder.
    """
    if isinstance(spec, Mapping):
        return validate(Schema, spec, ctx, key)
    if not isinstance(spec, str):
        raise ctx.error(key, f"expected a builtin name (criteo), a file or a mapping; got {spec!r}")
    base = Path(ctx.source).parent if ctx.source.endswith((".yaml", ".yml")) else None
    try:
        return load_schema(spec, base)
    except ConfigError as e:
        raise ctx.error(key, str(e)) from None

"""The ``tables`` section: embedding tables beside the default one, each holding some of the
schema's categorical fields with its own dim, sparse optimizer, initialisation, admission and
expiry.

::

    tables:
      - name: ids
        dim: 32
        features: [C3, C4, C12, C16, C21, C24]
        admission: {min_count: 2}
      - name: small
        dim: 8
        features: [C6, C9, C14, C17, C20, C22, C23, C25]

A key an entry leaves out is the ``table`` section's (``dim``, ``optimizer``, ``seed``, ...);
a sub-mapping it writes (``optimizer``, ``admission``, ``expiry``) changes only the keys it
names. Parsed entries hold the filled-in values, so a run's config.yaml says every table's
settings and reads back equal. The fields no entry lists stay in the default table, built from
``table`` (:meth:`daskhps.config.RunConfig.embedding_tables`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, WithJsonSchema, field_validator, model_validator

from daskhps.config.table import (
    AdmissionConfig,
    DeviceTierConfig,
    ExpiryConfig,
    HostTierConfig,
    TableConfig,
    store_name,
)
from daskhps.data.keyspace import MAX_TABLES
from daskhps.data.schema import expand_ranges
from daskhps.models.spec import ModelSpec
from daskhps.options import (
    Ctx,
    Int,
    Options,
    Problem,
    Seq,
    closest,
    options_in,
    shown,
    validate,
)
from daskhps.table.admission import AdmissionRule
from daskhps.table.optimizers import OptimizerSpec
from daskhps.table.spec import TableSpec
from daskhps.tier_sizing import OwnBudget

__all__ = ["TableEntry", "default_table", "parse_tables", "taken_from_table"]

# Every key of a run with several tables holds its table's index in bits 56..62.
# The keys an entry takes from the table section when it leaves them out (or writes null;
# init_scale's null is a value: 1/sqrt(dim)), and those of them whose mapping it may write in
# part.
_FROM_TABLE = ("dim", "optimizer", "init_scale", "seed", "admission", "expiry")
_MERGED = ("optimizer", "admission", "expiry")
_FEATURE_KEYS = ("name", "dim")

# What editors are told a feature entry is (the loader checks the rest).
_FEATURES_JSON = {
    "type": "array",
    "minItems": 1,
    "items": {
        "anyOf": [
            {"type": "string"},
            {
                "type": "object",
                "properties": {"name": {"type": "string"}, "dim": {"type": "integer"}},
                "required": ["name"],
                "additionalProperties": False,
            },
        ]
    },
}


def feature_items(written: Sequence[Any]) -> list[tuple[int, str]]:
    """``(index as written, field name)`` of every feature of a written ``features`` list,
    ``C{1..3}`` expanded (so an error points at the line that names the field)."""
    out: list[tuple[int, str]] = []
    for i, item in enumerate(written):
        name = item.get("name") if isinstance(item, Mapping) else item
        if not isinstance(name, str):
            raise Problem(
                f"features[{i}]",
                f"expected a field name or a mapping with keys name, dim; got {item!r}",
            )
        out.extend((i, n) for n in expand_ranges([name], f"features[{i}]"))
    return out


def _feature_names(written: Any, dim: Any, own_dim: bool = True) -> Any:
    """The field names of a written ``features`` list; a mapping entry's ``dim`` must be the
    table's (the features of a table share its rows' width)."""
    if not isinstance(written, list | tuple):
        return written  # the field says what it expects
    for i, item in enumerate(written):
        if isinstance(item, Mapping):
            _check_feature(item, f"features[{i}]", dim, own_dim)
    return [name for _, name in feature_items(written)]


def _check_feature(item: Mapping[Any, Any], key: str, dim: Any, own_dim: bool) -> None:
    """A feature written as a mapping: its keys, its name, then its dim (each checked before
    the next reads it: a ``dim`` is compared only once it is a dim, of a named feature).
    ``own_dim``: the entry writes the table's ``dim`` (else it is ``table.dim``)."""
    for k in item:
        if k not in _FEATURE_KEYS:
            hint = closest(str(k), _FEATURE_KEYS)
            did = f"did you mean {hint!r}? " if hint else ""
            raise Problem(
                f"{key}.{k}",
                f"unknown key; {did}a feature is a field name or a mapping with keys "
                f"{', '.join(_FEATURE_KEYS)}",
            )
    if not isinstance(item.get("name"), str):  # said before a dim that may differ
        raise Problem(key, f"expected a field name or a mapping with keys name, dim; got {item!r}")
    fdim = item.get("dim")
    if fdim is None:
        return
    if isinstance(fdim, float) and fdim.is_integer() and abs(fdim) < 2**53:
        fdim = int(fdim)  # YAML's 1e1 (as Int reads a table's dim)
    if isinstance(fdim, bool) or not isinstance(fdim, int):
        raise Problem(f"{key}.dim", f"expected int, got {type(fdim).__name__} {fdim!r}")
    if fdim < 1:  # a dim no table can have: not one to go and list the feature under
        raise Problem(f"{key}.dim", f"must be >= 1, got {fdim!r}")
    if isinstance(dim, int) and fdim != dim:
        table = "" if own_dim else " (table.dim: the entry writes no dim)"
        fix = "" if own_dim else f"write dim: {fdim} in the entry, "
        raise Problem(
            f"{key}.dim",
            f"{fdim!r} differs from the table's dim {dim}{table}; the features of a table "
            f"share its dim: {fix}list {item['name']!r} in a table of dim {fdim!r}, or drop "
            "its dim",
        )


class TableTiersConfig(Options):
    """A table's own tier budgets: each one written is the table's alone (a fraction of the
    worker memory limit, or device rows); each one left out the table shares with the other
    tables that leave it out (``table.tiers``, about the same rows each)."""

    device: DeviceTierConfig | None = None
    """The table's own device cache: `rows` or `fraction`; null: a share of the run's."""
    host: HostTierConfig | None = None
    """The table's own host tier; null: a share of the run's."""
    policy: Literal["lru", "lfu"] | None = None
    """Eviction policy of the table's device and host tiers; null: `table.tiers.policy`."""

    def budget(self) -> OwnBudget:
        d, h = self.device, self.host
        return OwnBudget(
            device_fraction=d.fraction if d is not None else None,
            device_rows=d.rows if d is not None else None,
            host_fraction=h.fraction if h is not None else None,
            policy=self.policy,
        )


class TableEntry(Options):
    """One embedding table of ``tables``: the categorical fields it holds (``features``) and
    the table's settings. A key left out is the ``table`` section's; the features of a table
    share its ``dim``. A row starts as a pure function of (``seed``, key)."""

    name: str
    """Table name (store paths, messages); unique among the tables."""
    dim: Int = Field(16, ge=1)
    """Embedding dim of every feature of the table; the model may add columns."""
    features: Annotated[Seq[str], WithJsonSchema(_FEATURES_JSON)] = Field(
        json_schema_extra=shown("list of field names (or `{name, dim}`)")
    )
    """Categorical fields of the schema the table holds; `C{1..3}` is C1, C2, C3 (quoted in
    `[...]`: `"C{1..3}"`)."""
    shared_keys: bool = False
    """Features hash into one key space: a value in two of them is one row."""
    optimizer: OptimizerSpec = OptimizerSpec()
    """Sparse optimizer; a key left out is `table.optimizer`'s."""
    init_scale: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    """Uniform init bound; null: `1/sqrt(dim)`."""
    seed: Int = Field(0, ge=0)
    """Initialisation seed: a row starts as f(seed, key)."""
    admission: AdmissionConfig = AdmissionConfig()
    """When a key gets a row; a key left out is `table.admission`'s."""
    expiry: ExpiryConfig = ExpiryConfig()
    """When rows leave the table; a key left out is `table.expiry`'s."""
    tiers: TableTiersConfig | None = None
    """The table's own tier budgets and policy; null: shares of `table.tiers`."""

    @model_validator(mode="before")
    @classmethod
    def _written_forms(cls, data: Any, info: ValidationInfo) -> Any:
        # The table section (in the context) fills what the entry leaves out; the features
        # are names once their ranges are expanded.
        if not isinstance(data, Mapping):
            return data
        d = dict(data)
        table = (info.context or {}).get("table")
        if isinstance(table, TableConfig):
            inherited = table.to_dict()
            for key in _FROM_TABLE:
                if key not in d or (d[key] is None and key != "init_scale"):
                    d[key] = inherited[key]
                elif key in _MERGED and isinstance(d[key], Mapping):
                    d[key] = {**inherited[key], **d[key]}
        if "features" in d:
            dim = d.get("dim")
            dim = int(dim) if isinstance(dim, float) and dim.is_integer() else dim
            # a dim the entry leaves to table.dim is named as such: the entry writes none
            written = data.get("dim") is not None
            d["features"] = _feature_names(d["features"], dim, written)
        return d

    @field_validator("name")
    @classmethod
    def _store_name(cls, name: str) -> str:
        return store_name(name)

    @model_validator(mode="after")
    def _holds_a_field(self) -> TableEntry:
        if not self.features:
            raise Problem(
                "features",
                "empty; a table holds at least one categorical field (leave the table out "
                "and its fields stay in the default table)",
            )
        return self

    @property
    def admission_rule(self) -> AdmissionRule:
        """The admission rule of this table (seeded with the table's seed)."""
        return self.admission.rule(self.seed)

    def spec(self, model: ModelSpec) -> TableSpec:
        """The table's :class:`TableSpec`: its rows are ``model.sparse_dim(dim)`` wide."""
        return TableSpec(
            self.name, model.sparse_dim(self.dim), self.optimizer, self.seed, self.init_scale
        )


def default_table(table: TableConfig, features: Sequence[str]) -> TableEntry:
    """The table of the fields no entry lists: the ``table`` section's, one key space a field."""
    return TableEntry(
        name=table.name,
        dim=table.dim,
        features=tuple(features),
        shared_keys=False,
        optimizer=table.optimizer,
        init_scale=table.init_scale,
        seed=table.seed,
        admission=table.admission,
        expiry=table.expiry,
    )


def taken_from_table(written: Any) -> dict[str, str]:
    """``{tables[i].key: table.key}`` for every key an entry of the written ``tables`` list
    leaves to the table section, a key of a mapping it writes in part included: where a
    message about the entry's value finds the line that writes it."""
    out: dict[str, str] = {}
    for i, item in enumerate(written if isinstance(written, list | tuple) else ()):
        if not isinstance(item, Mapping):
            continue
        for key in _FROM_TABLE:
            value = item.get(key)
            if key not in item or (value is None and key != "init_scale"):  # as _written_forms
                out[f"tables[{i}].{key}"] = f"table.{key}"
            elif key in _MERGED and isinstance(value, Mapping):
                section = options_in(TableEntry.model_fields[key].annotation)
                for sub in section.key_names() if section is not None else ():
                    if sub not in value:
                        out[f"tables[{i}].{key}.{sub}"] = f"table.{key}.{sub}"
    return out


def _fields_text(names: Sequence[str]) -> str:
    shown_ = ", ".join(names[:8])
    return f"{shown_}, ... ({len(names)} fields)" if len(names) > 8 else shown_


def _owners(
    d: Sequence[Any],
    entries: Sequence[TableEntry],
    ctx: Ctx,
    fields: Sequence[str],
    dense: Sequence[str],
) -> dict[str, tuple[int, int]]:
    """``{field: (table, feature as written)}`` of the written entries ``d``, every feature a
    categorical field of the schema that no other feature names."""
    owner: dict[str, tuple[int, int]] = {}
    for i, item in enumerate(d):
        written = item["features"]
        for j, name in feature_items(written):
            key = f"tables[{i}].features[{j}]"
            # a field of a range (C27 of C{1..30}) says which: the file does not name it
            w = written[j].get("name") if isinstance(written[j], Mapping) else written[j]
            said = f"{name!r}" if w == name else f"{name!r} (of {w!r})"
            if name not in fields:
                what = "a dense field" if name in dense else "not a field of the schema"
                same = [f for f in fields if f.lower() == name.lower()]
                did = f"did you mean {same[0]!r}? " if same else ""  # c3 for C3
                raise ctx.error(
                    key,
                    f"{said} is {what}; {did}a table holds categorical fields "
                    f"({_fields_text(fields)})",
                )
            if name in owner:
                t, k = owner[name]
                where = (
                    f"listed before (tables[{t}].features[{k}])"
                    if t == i
                    else f"already in table {entries[t].name!r} (tables[{t}])"
                )
                raise ctx.error(key, f"{said} is {where}; a feature belongs to one table")
            owner[name] = (i, j)
    return owner


def parse_tables(
    d: Any, ctx: Ctx, fields: Sequence[str], dense: Sequence[str], table: TableConfig
) -> tuple[TableEntry, ...]:
    """The ``tables`` section as read from YAML, every entry filled in from ``table`` and
    checked against the schema's categorical ``fields`` (``dense``: its dense ones, named in
    a message) and the other entries."""
    if d is None:
        return ()
    if not isinstance(d, list | tuple):
        raise ctx.error(
            "tables",
            f"expected a list of tables (mappings with keys "
            f"{', '.join(TableEntry.key_names())}); got {d!r}",
        )
    for i, item in enumerate(d):
        if item is None:  # "- " left empty: not a table of defaults (its name is required)
            keys = ", ".join(TableEntry.key_names())
            raise ctx.error(f"tables[{i}]", f"expected a mapping with keys {keys}; got null")
    entries = tuple(
        validate(TableEntry, item, ctx, f"tables[{i}]", {"table": table})
        for i, item in enumerate(d)
    )
    owner = _owners(d, entries, ctx, fields, dense)
    names: dict[str, int] = {}
    rest = [f for f in fields if f not in owner]
    for i, entry in enumerate(entries):
        if entry.name in names:
            raise ctx.error(
                f"tables[{i}].name",
                f"{entry.name!r} is the name of tables[{names[entry.name]}] too; "
                "table names are unique (they name the stores)",
            )
        if entry.name == table.name and rest:
            raise ctx.error(
                f"tables[{i}].name",
                f"{entry.name!r} is the default table's name (table.name), and the default "
                f"table holds the fields no table lists ({_fields_text(rest)}); rename this "
                "table or set table.name",
            )
        names[entry.name] = i
    total = len(entries) + (1 if rest else 0)
    if total > MAX_TABLES:
        raise ctx.error(
            "tables",
            f"{total} tables (the default table included) is more than {MAX_TABLES}; a key "
            "holds its table's index in 7 bits",
        )
    return entries

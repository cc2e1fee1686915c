"""The feature pipeline written out for a serving stack outside daskhps (``export.json``):
how a raw log row becomes the model's ``dense`` and ``sparse`` inputs.

It describes :func:`daskhps.data.parse.transform_dense` (dense fields), the categorical parsing of
:mod:`daskhps.data.parse` and the key function of :mod:`daskhps.data.hashing`; tests pin each
description against the code it describes (tests/serve/test_export_spec.py).
"""

from __future__ import annotations

from typing import Any

from daskhps.data.hashing import field_salt, hash_spec
from daskhps.data.keyspace import LOW_MASK, TABLE_SHIFT
from daskhps.data.schema import DenseField, Schema

__all__ = ["DENSE_RULE", "dense_spec", "features", "key_hash"]

DENSE_RULE = [
    "x = the cell as a float (a cell that is not a number makes the whole row bad: dropped)",
    "x = min(max(x, clip_min), clip_max); a null bound is no bound",
    "x = log1p(x) when transform is log1p; identity: unchanged",
    "an empty (missing) cell gives fill instead: fill is the model's input, not transformed",
    "the model reads float32",
]

CATEGORICAL_RULE = [
    "one key per field: key(field, cell) of key_hash; an empty cell is missing",
    "multi-hot (a separator): split the cell on it, drop empty tokens, one key per token; "
    "no token at all: [missing_key]; the field's input row is the sum or mean (pooling) of "
    "its keys' rows",
]


def dense_spec(f: DenseField) -> dict[str, Any]:
    """The parameters :data:`DENSE_RULE` applies to field ``f``."""
    return {
        "name": f.name,
        "clip_min": f.clip_min,
        "clip_max": f.clip_max,
        "transform": f.transform,
        "fill": f.fill,
    }


def _renamed(schema: Schema) -> bool:
    """Whether some field's keys are not its own name's salt alone: tagged with a table, or
    salted with a shared table's name."""
    keys = schema.field_keys
    return keys.tables is not None or keys.salts != schema.categorical_names


def features(schema: Schema) -> dict[str, Any]:
    """From a raw row of ``schema``'s logs to the model's inputs: how to read it, transform
    the dense fields and key the categorical ones (64-bit values as 16-digit hex strings, as
    in ``key_hash``). A field's ``salt`` and ``missing_key`` are its keys' as the run makes
    them (:attr:`Schema.field_keys`): with several tables (or a table of shared keys) each
    field also names the name it is salted with (``salt_name``) and its table's index
    (``table``, None for one table)."""
    keys = schema.field_keys
    renamed = _renamed(schema)
    return {
        "schema": schema.to_dict(),  # format, columns in order, delimiter, label
        "dense_rule": DENSE_RULE,
        "dense": [dense_spec(f) for f in schema.dense],
        "categorical_rule": CATEGORICAL_RULE,
        "categorical": [
            {
                "name": f.name,
                **(
                    {
                        "salt_name": keys.salts[i],
                        "table": None if keys.tables is None else keys.tables[i],
                    }
                    if renamed
                    else {}
                ),
                "salt": f"0x{field_salt(keys.salts[i]):016x}",
                "missing_key": f"0x{keys.missing(i):016x}",
                "separator": f.separator,
                "pooling": f.pooling,
            }
            for i, f in enumerate(schema.categorical)
        ],
    }


def key_hash(schema: Schema) -> dict[str, Any]:
    """``export.json``'s ``key_hash``: :func:`~daskhps.data.hashing.hash_spec`, and for a run
    with several tables (or a table of shared keys) how a field's salt is named and its keys
    carry their table (:mod:`daskhps.data.keyspace`)."""
    spec = hash_spec()
    if not _renamed(schema):
        return spec
    spec["definition"] += [
        "salt name: a field is salted with its own name, or with its table's name where the "
        "table has shared_keys (features.categorical[i].salt_name), so a value has one key in "
        "every field of such a table: key(field, value) above reads salt(salt name)",
        "several tables (features.categorical[i].table not null): tagged key = (key AND "
        "LOW_MASK) OR (table << TABLE_SHIFT), the table's index in bits 56..62 and bit 63 "
        "zero; a missing value's key is tagged alike (features.categorical[i].missing_key is "
        "the tagged one). The tagged key is the key of the dump and of unseen_keys",
    ]
    spec["constants"] |= {"TABLE_SHIFT": f"0x{TABLE_SHIFT:016x}", "LOW_MASK": f"0x{LOW_MASK:016x}"}
    return spec

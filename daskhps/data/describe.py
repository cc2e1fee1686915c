"""The feature pipeline written out for a serving stack outside daskhps (``export.json``):
how a raw log row becomes the model's ``dense`` and ``sparse`` inputs.

It describes :func:`daskhps.data.parse._dense_out` (dense fields), the categorical parsing of
:mod:`daskhps.data.parse` and the key function of :mod:`daskhps.data.hashing`; tests pin each
description against the code it describes (tests/serve/test_export_spec.py).
"""

from __future__ import annotations

from typing import Any

from daskhps.data.hashing import field_salt, missing_key
from daskhps.data.schema import DenseField, Schema

__all__ = ["DENSE_RULE", "dense_spec", "features"]

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


def features(schema: Schema) -> dict[str, Any]:
    """From a raw row of ``schema``'s logs to the model's inputs: how to read it, transform
    the dense fields and key the categorical ones (64-bit values as 16-digit hex strings, as
    in ``key_hash``)."""
    return {
        "schema": schema.to_dict(),  # format, columns in order, delimiter, label
        "dense_rule": DENSE_RULE,
        "dense": [dense_spec(f) for f in schema.dense],
        "categorical_rule": CATEGORICAL_RULE,
        "categorical": [
            {
                "name": f.name,
                "salt": f"0x{field_salt(f.name):016x}",
                "missing_key": f"0x{missing_key(f.name):016x}",
                "separator": f.separator,
                "pooling": f.pooling,
            }
            for f in schema.categorical
        ],
    }

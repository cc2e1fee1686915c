"""Click logs in: schemas, readers, hashing to int64 keys, bad-row policy, synthetic logs.

The path of one row: :mod:`~daskhps.data.source` finds the files, :mod:`~daskhps.data.readers`
reads them as a Dask dataframe, :mod:`~daskhps.data.parse` validates each line under the
:mod:`~daskhps.data.badrows` policy, transforms dense values and hashes categorical values with
:mod:`~daskhps.data.hashing`. :mod:`~daskhps.data.synthetic` writes Criteo-format logs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from daskhps._lazy import lazy_attribute
from daskhps.data.badrows import BadRowPolicy, BadRowReport, Reason
from daskhps.data.hashing import field_salt, hash_column, hash_values, missing_key
from daskhps.data.parse import read_shard
from daskhps.data.schema import CategoricalField, DenseField, Schema, criteo_schema, load_schema
from daskhps.data.source import DataSource, resolve_files

if TYPE_CHECKING:
    from daskhps.data.readers import ClickLog, read_click_log

# readers builds Dask dataframes: it is loaded on first use of its names, so that importing
# daskhps.data.hashing or daskhps.config (which run this file first) does not import dask.
_LAZY = {"ClickLog": "readers", "read_click_log": "readers"}

__all__ = [
    "BadRowPolicy",
    "BadRowReport",
    "CategoricalField",
    "ClickLog",
    "DataSource",
    "DenseField",
    "Reason",
    "Schema",
    "criteo_schema",
    "field_salt",
    "hash_column",
    "hash_values",
    "load_schema",
    "missing_key",
    "read_click_log",
    "read_shard",
    "resolve_files",
]


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name)

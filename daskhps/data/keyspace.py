"""Which table a key belongs to, written into the key itself.

With one embedding table (no ``tables:`` in the config) keys are exactly
:mod:`daskhps.data.hashing`'s: 63 bits of hash. With several, every key carries its table's
index in bits 56..62, and keeps 56 bits of hash below::

    bit   63   62 ........ 56   55 .............................. 0
          0    table index       hps64(value, salt) AND LOW_MASK

So the table travels with the key through every stage that only moves keys (deduplication,
owner routing, the shuffles, the exchange) and each worker splits what it receives by
``key >> TABLE_SHIFT``. 56 bits leave about 7 * 10**16 keys per table: a table of 10**9 keys
merges a handful of pairs by collision, as 63 bits merge a pair of 10**10.

A field's keys are ``hps64(value, salt(name))``, where ``name`` is the field's own name, or
the table's name when its table has ``shared_keys``: then the same value in two of its fields
is one key, one row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from daskhps.data.hashing import hash_column, hash_rows, missing_key

__all__ = ["LOW_MASK", "MAX_TABLES", "TABLE_SHIFT", "FieldKeys", "table_of"]

TABLE_SHIFT = 56
MAX_TABLES = 127  # keys stay non-negative: the table index fills bits 56..62
LOW_MASK = (1 << TABLE_SHIFT) - 1


def table_of(keys: np.ndarray) -> np.ndarray:
    """The table index of each int64 key of a run with several tables."""
    return keys >> TABLE_SHIFT


@dataclass(frozen=True)
class FieldKeys:
    """How the values of each categorical field (schema order) become keys.

    ``salts[i]`` is the name whose salt hashes field ``i``; ``tables[i]`` its table's index,
    or ``tables`` None for a run with one table (keys untagged, as they always were).
    """

    salts: tuple[str, ...]
    tables: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.tables is not None:
            if len(self.tables) != len(self.salts):
                raise ValueError(f"{len(self.tables)} table indices for {len(self.salts)} fields")
            if any(not 0 <= t <= MAX_TABLES for t in self.tables):
                raise ValueError(f"table indices must be in 0..{MAX_TABLES}, got {self.tables}")

    def hash(self, values: object, field: int) -> np.ndarray:
        """int64 keys of field ``field``'s values (a missing value has the missing key)."""
        return self.tag(hash_column(values, self.salts[field]), field)

    def hash_rows(self, cells: Any) -> np.ndarray:
        """Keys of rows of cells of every field in one pass, ``int64[n, F]``: cell ``i * F + j``
        is field ``j`` of row ``i`` (:func:`~daskhps.data.hashing.hash_rows`), each key the one
        :meth:`hash` gives it (salted, and tagged with its table)."""
        keys = hash_rows(cells, self.salts)
        if self.tables is not None:
            keys &= LOW_MASK
            keys |= np.array(self.tables, dtype=np.int64) << TABLE_SHIFT
        return keys

    def missing(self, field: int) -> int:
        """The key of a missing value of field ``field``."""
        return int(self.tag(np.array([missing_key(self.salts[field])], np.int64), field)[0])

    def tag(self, keys: np.ndarray, field: int) -> np.ndarray:
        """``keys`` (hashes of field ``field``) with the field's table index written in."""
        if self.tables is None:
            return keys
        keys &= LOW_MASK
        keys |= self.tables[field] << TABLE_SHIFT
        return keys

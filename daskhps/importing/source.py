"""What ``daskhps import`` reads: chunks of rows from one of two inputs.

::

    npy       --keys keys.npy --rows embeddings.npy [--state state.npy]   (importing/npy.py)
              keys int64[n] (uint64: the same bits), embeddings float32[n, dim], state
              float32[n, state width]
    parquet   --rows FILE|FOLDER|GLOB ...                             (importing/parquet.py)
              a key column (int64 or uint64; default name ``key``) and the embedding, either
              one list or fixed-size list column of floats (default ``embedding``) or ``dim``
              float columns ``embedding_0`` .. ``embedding_<dim-1>``; the optimizer state, if
              any, the same way (``state`` / ``state_0`` ..); other columns are ignored

Everything that a file's metadata can tell (missing files, shapes, dtypes, columns) is checked
by :meth:`Source.check` before a row is read, so a bad file fails before anything is written;
what only the values tell (a list of the wrong length, a null) fails at its chunk, naming the
file and the row (rows count from 0, as numpy and pyarrow index them). float64 values are
rounded to float32, the table's type.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from daskhps.errors import DataError
from daskhps.table.spec import TableSpec

__all__ = [
    "Chunk",
    "Source",
    "as_floats",
    "as_keys",
    "missing_file",
    "open_source",
    "state_layout",
]


@dataclass(frozen=True)
class Chunk:
    """Consecutive rows of one input: ``keys[i]``, ``weights[i]`` and ``state[i]`` are row
    ``start + i`` of their files (``state`` is None when the input holds none)."""

    keys: np.ndarray  # int64[n]
    weights: np.ndarray  # float32[n, dim]
    state: np.ndarray | None  # float32[n, state width]
    keys_file: str
    rows_file: str
    state_file: str | None
    start: int

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def key_row(self, i: int) -> str:
        return f"{self.keys_file} row {self.start + i}"

    def weight_row(self, i: int) -> str:
        return f"{self.rows_file} row {self.start + i}"

    def state_row(self, i: int) -> str:
        return f"{self.state_file} row {self.start + i}"


class Source:
    """Rows to import, in chunks; see the module docstring for the formats."""

    spec: TableSpec
    dim_key: str = "table.dim"  # the config key of the table's dim, for messages

    @property
    def rows(self) -> int:
        """Rows in all the input (from the files' metadata)."""
        raise NotImplementedError

    @property
    def has_state(self) -> bool:
        raise NotImplementedError

    def files(self) -> list[str]:
        raise NotImplementedError

    def check(self) -> None:
        """Every check the files' metadata allows; :class:`DataError` naming the file."""
        raise NotImplementedError

    def chunks(self, chunk_rows: int) -> Iterator[Chunk]:
        raise NotImplementedError

    def key_chunks(self, chunk_rows: int) -> Iterator[tuple[str, int, np.ndarray]]:
        """``(file, first row, keys)`` of each chunk, reading keys only (an error's second
        look, e.g. for where a duplicate key first appeared)."""
        raise NotImplementedError


def as_keys(a: np.ndarray) -> np.ndarray:
    return a.view(np.int64) if a.dtype == np.uint64 else a.astype(np.int64, copy=False)


def as_floats(a: np.ndarray) -> np.ndarray:
    # float64 beyond float32's range becomes an infinity, which the value checks then name
    # (in one line: no numpy overflow warning before it)
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(a, dtype=np.float32)


def missing_file(path: Path, flag: str) -> DataError:
    return DataError(f"{path}: no such file ({flag}); check the path")


def state_layout(spec: TableSpec) -> str:
    """What the optimizer state of ``spec``'s rows is, for messages about its width."""
    opt = spec.optimizer
    what = "row-wise adagrad" if opt.row_wise else opt.kind
    return f"the state of {what} at dim {spec.dim}; see docs/table.md"


def open_source(
    spec: TableSpec,
    rows: Sequence[str],
    *,
    keys: str | None = None,
    state: str | None = None,
    key_column: str = "key",
    embedding_column: str = "embedding",
    state_column: str = "state",
    table: str | None = None,
    dim_key: str = "table.dim",
) -> Source:
    """The source ``--rows`` (and ``--keys``, ``--state``) name: the npy pair when the rows
    are one ``.npy`` file, parquet otherwise. Nothing is read yet (:meth:`Source.check`).

    ``table``: the table these files are given for as ``TABLE=PATH`` (a config with several
    tables; messages then show the flags that way); ``dim_key``: the config key of its dim."""
    at = "" if table is None else f"{table}="
    npy = [r for r in rows if r.endswith(".npy")]
    source: Source
    if npy:
        if len(rows) != 1:
            shown = " ".join(at + r for r in rows)
            raise DataError(
                f"--rows {shown}: give one .npy file of embeddings (with --keys), or parquet "
                "files only"
            )
        if keys is None:
            flag, export = (
                ("--keys", "keys.npy")
                if table is None
                else (
                    f"--keys {table}=KEYS.npy",
                    f"keys-{table}.npy",
                )
            )
            raise DataError(
                f"--rows {at}{rows[0]} is a .npy file: give its keys with {flag} (the {export} "
                "of the same export)"
            )
        from daskhps.importing.npy import NpySource  # each format's module imports this one

        source = NpySource(spec, keys, rows[0], state)
    else:
        for flag, value in (("--keys", keys), ("--state", state)):
            if value is not None:
                raise DataError(
                    f"{flag} {at}{value}: with parquet --rows, the keys and the optimizer state "
                    "are columns of the parquet files (--key-column, --state-column); leave out "
                    f"{flag}"
                )
        from daskhps.importing.parquet import ParquetSource

        source = ParquetSource(
            spec,
            rows,
            key_column=key_column,
            embedding_column=embedding_column,
            state_column=state_column,
        )
    source.dim_key = dim_key
    return source

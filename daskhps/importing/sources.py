"""The inputs of ``daskhps import``, read in chunks of rows: the ``.npy`` pair ``daskhps
export`` writes, or parquet files.

::

    npy       --keys keys.npy --rows embeddings.npy [--state state.npy]
              keys int64[n] (uint64: the same bits), embeddings float32[n, dim], state
              float32[n, state width]; read through memory maps
    parquet   --rows FILE|FOLDER|GLOB ...
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

import glob
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from daskhps.errors import DataError
from daskhps.table.optimizers import state_width
from daskhps.table.spec import TableSpec

__all__ = ["Chunk", "NpySource", "ParquetSource", "Source", "open_source"]

_KEY_TYPES = (np.dtype(np.int64), np.dtype(np.uint64))
_FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float64))
_PARQUET_SUFFIXES = (".parquet", ".pq")


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


def _as_keys(a: np.ndarray) -> np.ndarray:
    return a.view(np.int64) if a.dtype == np.uint64 else a.astype(np.int64, copy=False)


def _as_floats(a: np.ndarray) -> np.ndarray:
    # float64 beyond float32's range becomes an infinity, which the value checks then name
    # (in one line: no numpy overflow warning before it)
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(a, dtype=np.float32)


def _read_rows(a: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)`` of a ``.npy`` memory map, read with a plain file read when they
    lie contiguously (C order, as numpy.save writes): the process then holds one chunk, not
    the mapped pages of every chunk read so far (which the kernel may reclaim, but which count
    as resident until it does)."""
    if isinstance(a, np.memmap) and a.flags.c_contiguous and a.filename is not None:
        per_row = int(np.prod(a.shape[1:], dtype=np.int64))
        out = np.fromfile(
            a.filename,
            dtype=a.dtype,
            count=(stop - start) * per_row,
            offset=a.offset + start * per_row * a.dtype.itemsize,
        )
        return out.reshape((stop - start, *a.shape[1:]))
    return np.array(a[start:stop])


def _missing(path: Path, flag: str) -> DataError:
    return DataError(f"{path}: no such file ({flag}); check the path")


# -- npy ----------------------------------------------------------------------------------


def _load_npy(path: Path, flag: str) -> np.ndarray:
    if not path.is_file():
        raise _missing(path, flag)
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(
            f"{path}: not a .npy array ({e}); {flag} takes a .npy file as numpy.save writes it"
        ) from None
    if not isinstance(a, np.ndarray):  # an .npz archive
        raise DataError(f"{path}: a .npz archive, not a .npy array; {flag} takes one .npy file")
    return a


class NpySource(Source):
    """``keys.npy`` and ``embeddings.npy`` as ``daskhps export`` writes them, and optionally
    a ``state.npy`` of the same rows' optimizer state."""

    def __init__(
        self, spec: TableSpec, keys: str | Path, rows: str | Path, state: str | Path | None
    ) -> None:
        self.spec = spec
        self.keys_path, self.rows_path = Path(keys), Path(rows)
        self.state_path = None if state is None else Path(state)
        self._keys: np.ndarray | None = None
        self._rows: np.ndarray | None = None
        self._state: np.ndarray | None = None

    @property
    def rows(self) -> int:
        assert self._keys is not None, "check() first"
        return int(self._keys.shape[0])

    @property
    def has_state(self) -> bool:
        return self.state_path is not None

    def files(self) -> list[str]:
        return [str(p) for p in (self.keys_path, self.rows_path, self.state_path) if p]

    def check(self) -> None:
        spec = self.spec
        keys = _load_npy(self.keys_path, "--keys")
        rows = _load_npy(self.rows_path, "--rows")
        if keys.ndim != 1 or keys.dtype not in _KEY_TYPES:
            raise DataError(
                f"{self.keys_path}: holds {keys.dtype}{list(keys.shape)}, but keys must be "
                "int64[n] (daskhps's hps64 keys, as `daskhps export` writes them); convert them "
                "to int64"
            )
        n = keys.shape[0]
        self._check_floats(rows, self.rows_path, "embedding", spec.dim, "table.dim", n)
        self._keys, self._rows = keys, rows
        if self.state_path is not None:
            width = state_width(spec.optimizer, spec.dim)
            if width == 0:
                raise DataError(
                    f"{self.state_path}: table {spec.name!r} uses the sgd optimizer, which keeps "
                    "no optimizer state; leave out --state"
                )
            state = _load_npy(self.state_path, "--state")
            self._check_floats(state, self.state_path, "optimizer state", width, _kind(spec), n)
            self._state = state

    def _check_floats(
        self, a: np.ndarray, path: Path, what: str, width: int, wanted: str, n: int
    ) -> None:
        if a.ndim != 2 or a.dtype not in _FLOAT_TYPES:
            raise DataError(
                f"{path}: holds {a.dtype}{list(a.shape)}, but the {what} must be "
                f"float32[n, {width}] ({wanted}); convert it"
            )
        if a.shape[1] != width:
            raise DataError(
                f"{path} row 0: {a.shape[1]} floats of {what} (shape {list(a.shape)}), but table "
                f"{self.spec.name!r} has {width} ({wanted}); give rows of {width} floats, or a "
                "config whose table matches them"
            )
        if a.shape[0] != n:
            raise DataError(
                f"{path}: {a.shape[0]} rows, but {self.keys_path} holds {n} keys; give the files "
                "of one export (row i of each is key i)"
            )

    def chunks(self, chunk_rows: int) -> Iterator[Chunk]:
        assert self._keys is not None and self._rows is not None, "check() first"
        state_file = None if self.state_path is None else str(self.state_path)
        for a in range(0, self.rows, chunk_rows):
            b = min(a + chunk_rows, self.rows)
            yield Chunk(
                keys=_as_keys(_read_rows(self._keys, a, b)),
                weights=_as_floats(_read_rows(self._rows, a, b)),
                state=None if self._state is None else _as_floats(_read_rows(self._state, a, b)),
                keys_file=str(self.keys_path),
                rows_file=str(self.rows_path),
                state_file=state_file,
                start=a,
            )

    def key_chunks(self, chunk_rows: int) -> Iterator[tuple[str, int, np.ndarray]]:
        assert self._keys is not None, "check() first"
        for a in range(0, self.rows, chunk_rows):
            b = min(a + chunk_rows, self.rows)
            yield str(self.keys_path), a, _as_keys(_read_rows(self._keys, a, b))


def _kind(spec: TableSpec) -> str:
    opt = spec.optimizer
    what = "row-wise adagrad" if opt.row_wise else opt.kind
    return f"the state of {what} at dim {spec.dim}; see docs/table.md"


# -- parquet ------------------------------------------------------------------------------


def parquet_files(patterns: Sequence[str]) -> list[Path]:
    """The parquet files that files, folders (their ``*.parquet`` and ``*.pq``, recursively)
    and globs name, each once, in sorted order per argument."""
    out: list[Path] = []
    for pattern in patterns:
        p = Path(pattern)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.suffix in _PARQUET_SUFFIXES and f.is_file())
            if not found:
                raise DataError(f"{p}: a folder with no .parquet file (--rows); check the path")
        elif p.is_file():
            found = [p]
        elif any(ch in pattern for ch in "*?["):
            found = sorted(Path(f) for f in glob.glob(pattern, recursive=True) if os.path.isfile(f))
            if not found:
                raise DataError(f"{pattern}: matches no file (--rows); check the pattern")
        else:
            raise _missing(p, "--rows")
        out.extend(f for f in found if f not in out)
    return out


@dataclass(frozen=True)
class _Floats:
    """Where a block of floats lives in a parquet file: one list column, or one column each."""

    label: str  # for messages: "column embedding" or "columns embedding_0..embedding_3"
    list_column: str | None
    columns: tuple[str, ...]

    @property
    def read(self) -> list[str]:
        return [self.list_column] if self.list_column else list(self.columns)


class ParquetSource(Source):
    """Parquet files of keys and rows (see the module docstring), read a row group's batch at
    a time."""

    def __init__(
        self,
        spec: TableSpec,
        paths: Sequence[str],
        *,
        key_column: str = "key",
        embedding_column: str = "embedding",
        state_column: str = "state",
    ) -> None:
        self.spec = spec
        self.patterns = list(paths)
        self.key_column = key_column
        self.embedding_column = embedding_column
        self.state_column = state_column
        self._files: list[Path] = []
        self._layout: list[tuple[_Floats, _Floats | None]] = []
        self._rows: list[int] = []

    @property
    def rows(self) -> int:
        return sum(self._rows)

    @property
    def has_state(self) -> bool:
        return any(state is not None for _, state in self._layout)

    def files(self) -> list[str]:
        return [str(f) for f in self._files]

    def check(self) -> None:
        import pyarrow.parquet as pq

        self._files = parquet_files(self.patterns)
        width = state_width(self.spec.optimizer, self.spec.dim)
        for f in self._files:
            try:
                meta = pq.ParquetFile(f)
            except Exception as e:  # pyarrow raises several types for a damaged file
                raise DataError(f"{f}: not a readable parquet file ({e})") from None
            schema = meta.schema_arrow
            self._check_key(f, schema)
            emb = self._floats(f, schema, self.embedding_column, self.spec.dim, "table.dim")
            assert emb is not None  # not optional: a missing embedding raised
            state = self._floats(
                f, schema, self.state_column, width, _kind(self.spec), optional=True
            )
            if state is not None and width == 0:
                raise DataError(
                    f"{f}: {state.label} holds optimizer state, but table {self.spec.name!r} uses "
                    "the sgd optimizer, which keeps none; drop the column"
                )
            self._layout.append((emb, state))
            self._rows.append(int(meta.metadata.num_rows))
        with_state = [s is not None for _, s in self._layout]
        if any(with_state) and not all(with_state):
            lacking = self._files[with_state.index(False)]
            raise DataError(
                f"{lacking}: no optimizer state column ({self.state_column}), but "
                f"{self._files[with_state.index(True)]} has one; give the state for every row "
                "or for none (then every row starts with the optimizer's initial state)"
            )

    def _check_key(self, f: Path, schema: Any) -> None:
        import pyarrow as pa

        name = self.key_column
        if name not in schema.names:
            raise DataError(
                f"{f}: no key column {name!r} (columns: {', '.join(schema.names)}); name it "
                "with --key-column"
            )
        t = schema.field(name).type
        if t not in (pa.int64(), pa.uint64()):
            raise DataError(
                f"{f}: key column {name!r} is {t}, but keys must be int64 (daskhps's hps64 "
                "keys, as `daskhps export` writes them); convert the column to int64"
            )

    def _floats(
        self,
        f: Path,
        schema: Any,
        name: str,
        width: int,
        wanted: str,
        optional: bool = False,
    ) -> _Floats | None:
        import pyarrow as pa

        names = schema.names
        if name in names:
            t = schema.field(name).type
            is_list = pa.types.is_list(t) or pa.types.is_large_list(t)
            fixed = pa.types.is_fixed_size_list(t)
            if not (is_list or fixed) or not pa.types.is_floating(t.value_type):
                raise DataError(
                    f"{f}: column {name!r} is {t}, but it must be a list of floats (or give "
                    f"{width} float columns {name}_0..{name}_{width - 1})"
                )
            if fixed and t.list_size != width:
                raise DataError(
                    f"{f} row 0: column {name!r} holds lists of {t.list_size} floats, but table "
                    f"{self.spec.name!r} has {width} ({wanted}); give rows of {width} floats, "
                    "or a config whose table matches them"
                )
            return _Floats(f"column {name}", name, ())
        prefix = f"{name}_"
        numbered = {
            int(c[len(prefix) :]): c
            for c in names
            if c.startswith(prefix) and c[len(prefix) :].isdigit()
        }
        if not numbered:
            if optional:
                return None
            raise DataError(
                f"{f}: no column {name!r} (a list of floats) and no columns "
                f"{name}_0..{name}_{width - 1} (columns: {', '.join(names)}); name the column "
                f"with --{'embedding' if name == self.embedding_column else 'state'}-column"
            )
        if sorted(numbered) != list(range(len(numbered))) or len(numbered) != width:
            raise DataError(
                f"{f} row 0: columns {name}_0..{name}_{max(numbered)} are {len(numbered)} "
                f"floats, but table {self.spec.name!r} has {width} ({wanted}); give exactly "
                f"{name}_0..{name}_{width - 1}, or a config whose table matches them"
            )
        cols = tuple(numbered[i] for i in range(width))
        for c in cols:
            if not pa.types.is_floating(schema.field(c).type):
                raise DataError(
                    f"{f}: column {c!r} is {schema.field(c).type}, but it must hold floats"
                )
        return _Floats(f"columns {cols[0]}..{cols[-1]}", None, cols)

    def _batches(self, f: Path, columns: list[str], chunk_rows: int) -> Iterator[tuple[int, Any]]:
        import pyarrow.parquet as pq

        start = 0
        for batch in pq.ParquetFile(f).iter_batches(batch_size=chunk_rows, columns=columns):
            yield start, batch
            start += batch.num_rows

    def chunks(self, chunk_rows: int) -> Iterator[Chunk]:
        for f, (emb, state) in zip(self._files, self._layout, strict=True):
            cols = [self.key_column, *emb.read, *(state.read if state else [])]
            for start, batch in self._batches(f, cols, chunk_rows):
                where = f"{f}"
                keys = _key_array(batch.column(self.key_column), where, start, self.key_column)
                yield Chunk(
                    keys=keys,
                    weights=_float_block(batch, emb, self.spec.dim, where, start),
                    state=None
                    if state is None
                    else _float_block(
                        batch, state, state_width(self.spec.optimizer, self.spec.dim), where, start
                    ),
                    keys_file=where,
                    rows_file=where,
                    state_file=where if state is not None else None,
                    start=start,
                )

    def key_chunks(self, chunk_rows: int) -> Iterator[tuple[str, int, np.ndarray]]:
        for f in self._files:
            for start, batch in self._batches(f, [self.key_column], chunk_rows):
                col = batch.column(self.key_column)
                yield str(f), start, _key_array(col, str(f), start, self.key_column)


def _first_null(arr: Any) -> int:
    return int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])


def _key_array(col: Any, where: str, start: int, name: str) -> np.ndarray:
    if col.null_count:
        raise DataError(
            f"{where} row {start + _first_null(col)}: the key ({name}) is null; every row needs "
            "a key: fix or drop that row"
        )
    return _as_keys(col.to_numpy(zero_copy_only=False))


def _float_block(batch: Any, spec: _Floats, width: int, where: str, start: int) -> np.ndarray:
    """``float32[rows, width]`` of one batch's block of floats; :class:`DataError` naming the
    row of a null or of a list of another length."""
    import pyarrow.compute as pc

    n = batch.num_rows
    if spec.list_column is None:
        cols = [batch.column(c) for c in spec.columns]
        for c, name in zip(cols, spec.columns, strict=True):
            if c.null_count:
                raise DataError(
                    f"{where} row {start + _first_null(c)}: column {name} is null; every value "
                    "must be a finite float: fix or drop that row"
                )
        out = np.empty((n, width), dtype=np.float32)
        for j, c in enumerate(cols):
            out[:, j] = c.to_numpy(zero_copy_only=False)
        return out
    arr = batch.column(spec.list_column)
    if arr.null_count:
        raise DataError(
            f"{where} row {start + _first_null(arr)}: {spec.label} is null; every row needs "
            f"{width} floats: fix or drop that row"
        )
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(lengths != width)
    if wrong.size:
        i = int(wrong[0])
        raise DataError(
            f"{where} row {start + i}: {spec.label} holds {int(lengths[i])} floats, but the "
            f"table's rows have {width} here; give every row {width} floats"
        )
    values = arr.flatten()
    if values.null_count:
        i = _first_null(values) // width
        raise DataError(
            f"{where} row {start + i}: {spec.label} holds a null; every value must be a finite "
            "float: fix or drop that row"
        )
    return _as_floats(values.to_numpy(zero_copy_only=False).reshape(n, width))


def open_source(
    spec: TableSpec,
    rows: Sequence[str],
    *,
    keys: str | None = None,
    state: str | None = None,
    key_column: str = "key",
    embedding_column: str = "embedding",
    state_column: str = "state",
) -> Source:
    """The source ``--rows`` (and ``--keys``, ``--state``) name: the npy pair when the rows
    are one ``.npy`` file, parquet otherwise. Nothing is read yet (:meth:`Source.check`)."""
    npy = [r for r in rows if r.endswith(".npy")]
    if npy:
        if len(rows) != 1:
            raise DataError(
                f"--rows {' '.join(rows)}: give one .npy file of embeddings (with --keys), or "
                "parquet files only"
            )
        if keys is None:
            raise DataError(
                f"--rows {rows[0]} is a .npy file: give its keys with --keys (the keys.npy of "
                "the same export)"
            )
        return NpySource(spec, keys, rows[0], state)
    for flag, value in (("--keys", keys), ("--state", state)):
        if value is not None:
            raise DataError(
                f"{flag} {value}: with parquet --rows, the keys and the optimizer state are "
                "columns of the parquet files (--key-column, --state-column); leave out "
                f"{flag}"
            )
    return ParquetSource(
        spec,
        rows,
        key_column=key_column,
        embedding_column=embedding_column,
        state_column=state_column,
    )

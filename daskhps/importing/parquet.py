"""Parquet files of keys and rows, read a batch of a row group at a time (the columns:
:mod:`daskhps.importing.source`)."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from daskhps.errors import DataError
from daskhps.importing.source import Chunk, Source, as_floats, as_keys, missing_file, state_layout
from daskhps.table.optimizers import state_width
from daskhps.table.spec import TableSpec

__all__ = ["ParquetSource", "parquet_files"]

_PARQUET_SUFFIXES = (".parquet", ".pq")


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
            raise missing_file(p, "--rows")
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
            emb = self._floats(f, schema, self.embedding_column, self.spec.dim, self.dim_key)
            assert emb is not None  # not optional: a missing embedding raised
            state = self._floats(
                f, schema, self.state_column, width, state_layout(self.spec), optional=True
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
    return as_keys(col.to_numpy(zero_copy_only=False))


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
    return as_floats(values.to_numpy(zero_copy_only=False).reshape(n, width))

"""The ``.npy`` pair ``daskhps export`` writes (and an optional state), read in chunks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from daskhps.errors import DataError
from daskhps.importing.source import Chunk, Source, as_floats, as_keys, missing_file, state_layout
from daskhps.table.optimizers import state_width
from daskhps.table.spec import TableSpec

__all__ = ["NpySource"]

_KEY_TYPES = (np.dtype(np.int64), np.dtype(np.uint64))
_FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


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


def _load_npy(path: Path, flag: str) -> np.ndarray:
    if not path.is_file():
        raise missing_file(path, flag)
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
        self._check_floats(rows, self.rows_path, "embedding", spec.dim, self.dim_key, n)
        self._keys, self._rows = keys, rows
        if self.state_path is not None:
            width = state_width(spec.optimizer, spec.dim)
            if width == 0:
                raise DataError(
                    f"{self.state_path}: table {spec.name!r} uses the sgd optimizer, which keeps "
                    "no optimizer state; leave out --state"
                )
            state = _load_npy(self.state_path, "--state")
            self._check_floats(
                state, self.state_path, "optimizer state", width, state_layout(spec), n
            )
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
                keys=as_keys(_read_rows(self._keys, a, b)),
                weights=as_floats(_read_rows(self._rows, a, b)),
                state=None if self._state is None else as_floats(_read_rows(self._state, a, b)),
                keys_file=str(self.keys_path),
                rows_file=str(self.rows_path),
                state_file=state_file,
                start=a,
            )

    def key_chunks(self, chunk_rows: int) -> Iterator[tuple[str, int, np.ndarray]]:
        assert self._keys is not None, "check() first"
        for a in range(0, self.rows, chunk_rows):
            b = min(a + chunk_rows, self.rows)
            yield str(self.keys_path), a, as_keys(_read_rows(self._keys, a, b))

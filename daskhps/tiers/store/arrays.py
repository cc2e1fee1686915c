"""Immutable zarr v3 arrays on local disk, written with zarr-python and read without it.

The store writes each array once, uncompressed, with only the ``bytes`` codec, so every chunk
file is the chunk's rows as raw little-endian values (edge chunks padded to full size, as zarr
v3 stores them). :class:`RawArray` checks that from the array's ``zarr.json`` and then reads
chunk files directly (``np.fromfile`` / ``np.memmap``): zarr-python costs milliseconds per
call, far too much for scattered row reads. An array whose metadata says anything else (a
compressor added by another tool, big endian, sharding) is still read, through zarr-python.

Each array written here records the sha256 of every chunk file in its ``zarr.json``
(``attributes["sha256"]``, one hex digest per chunk, in chunk order), computed from the bytes
in memory as they are written: ``daskhps inspect --verify`` recomputes them from disk. Arrays
written before daskhps recorded checksums have no such attribute and are read the same way;
only their sizes can be checked.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BytesCodec
from zarr.storage import LocalStore

from daskhps.errors import StoreCorruptedError
from daskhps.tiers.store.durable import file_sha256

__all__ = ["RawArray", "chunk_digests", "read_around_pays", "write_array", "write_group"]

_RAW_CODECS = [{"name": "bytes", "configuration": {"endian": "little"}}]


def write_group(
    directory: Path, attributes: dict[str, Any] | None = None, *, durable: bool = False
) -> None:
    """Write the ``zarr.json`` of a zarr v3 group (the node that makes a folder a group);
    ``durable``: on disk before it replaces the one there (the caller fsyncs the folder)."""
    directory.mkdir(parents=True, exist_ok=True)
    meta = {"zarr_format": 3, "node_type": "group", "attributes": attributes or {}}
    # Replace atomically: a crash must not leave a half-written root zarr.json behind.
    tmp = directory / "zarr.json.tmp"
    with tmp.open("w") as f:
        f.write(json.dumps(meta, indent=2))
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, directory / "zarr.json")


def _rows_per_chunk(chunk_rows: int, n: int) -> int:
    return max(1, min(chunk_rows, n))


def chunk_digests(data: np.ndarray, chunk_rows: int) -> list[str]:
    """The sha256 of each chunk file :func:`write_array` writes for ``data``: the chunk's rows
    as little-endian bytes, the last one padded with zeros (the fill value) to a full chunk.
    Hashes the array in memory, in place (one pass over its bytes, no copy on little-endian
    machines)."""
    rows = _rows_per_chunk(chunk_rows, data.shape[0])
    flat = np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<"))
    row_bytes = math.prod(data.shape[1:]) * data.dtype.itemsize
    raw = flat.reshape(-1).view(np.uint8).data  # a flat byte view of the array, no copy
    out = []
    for start in range(0, data.shape[0], rows):  # a Python step per chunk, not per row
        part = raw[start * row_bytes : (start + rows) * row_bytes]
        h = hashlib.sha256(part)
        pad = rows * row_bytes - len(part)
        if pad:
            h.update(bytes(pad))
        out.append(h.hexdigest())
    return out


def write_array(directory: Path, data: np.ndarray, chunk_rows: int) -> RawArray:
    """Write ``data`` as a new uncompressed zarr v3 array; chunks span whole rows. Its
    metadata records the sha256 of each chunk file (:func:`chunk_digests`)."""
    rows = _rows_per_chunk(chunk_rows, data.shape[0])
    zarr.create_array(
        LocalStore(directory),
        data=data,
        chunks=(rows, *data.shape[1:]),
        compressors=None,
        filters=None,
        serializer=BytesCodec(endian="little"),
        fill_value=0,
        # Without this zarr skips chunks equal to the fill value and the files go missing,
        # which we could not tell apart from a damaged store.
        config={"write_empty_chunks": True},
        attributes={"sha256": chunk_digests(data, chunk_rows)},
    )
    return RawArray.load(directory, data.dtype)


READ_AROUND = 128 * 1024  # bytes Linux reads around a page fault of a mapped file by default


def read_around_pays(rows: int, chunk_rows: int, row_bytes: int) -> bool:
    """Whether reading ``rows`` rows spread over a chunk of ``chunk_rows`` rows through a
    plain memory map pays: each page fault reads about :data:`READ_AROUND` bytes around it
    into the page cache (and maps the cached pages near it), which is cheap when those bytes
    hold other rows being read and ruinous when they do not. Once a store outgrew the page
    cache, staging 90k rows of 772 bytes spread over 25M rows read 16 GB a worker. Below four
    wanted rows per window the map is advised random (one page a fault); that costs up to
    4x on a store the page cache holds, where faults are cheap.
    """
    return rows * (READ_AROUND // max(row_bytes, 1)) >= 4 * chunk_rows


@dataclass(frozen=True)
class RawArray:
    """A zarr v3 array on disk whose chunks are row blocks along axis 0.

    Attributes
    ----------
    path:
        The array's folder (holds ``zarr.json``).
    shape, chunk_rows, dtype:
        From the metadata; chunks always span every column.
    raw:
        True when chunk files are raw little-endian values that can be memory-mapped.
    sha256:
        The sha256 of each chunk file as recorded when the array was written; None for
        arrays written before daskhps recorded them, or re-coded by another tool.
    """

    path: Path
    shape: tuple[int, ...]
    chunk_rows: int
    dtype: np.dtype
    raw: bool
    separator: str = "/"
    sha256: tuple[str, ...] | None = None

    @classmethod
    def load(cls, path: Path, dtype: np.dtype | type) -> RawArray:
        """Read ``zarr.json``; raise :class:`StoreCorruptedError` naming it when it is
        missing, unparsable, or describes something other than a ``dtype`` row array."""
        meta_path = path / "zarr.json"
        try:
            meta = json.loads(meta_path.read_text())
            shape = tuple(int(s) for s in meta["shape"])
            grid = meta["chunk_grid"]
            chunks = tuple(int(c) for c in grid["configuration"]["chunk_shape"])
            dt = np.dtype(meta["data_type"])
        except FileNotFoundError as e:
            raise StoreCorruptedError(f"array metadata {meta_path} is missing") from e
        except (ValueError, KeyError, TypeError) as e:
            raise StoreCorruptedError(f"array metadata {meta_path} is unreadable ({e})") from e
        want = np.dtype(dtype)
        if dt != want or len(shape) < 1 or len(chunks) != len(shape):
            raise StoreCorruptedError(
                f"array {path} holds {meta.get('data_type')} of shape {shape}, "
                f"expected a {want} row array"
            )
        if grid.get("name") != "regular" or chunks[1:] != shape[1:] or chunks[0] < 1:
            # Another tool re-chunked it; zarr-python can still read it.
            return cls(path, shape, max(chunks[0], 1), dt, raw=False)
        enc = meta.get("chunk_key_encoding", {})
        separator = enc.get("configuration", {}).get("separator", "/")
        raw = (
            meta.get("codecs") == _RAW_CODECS
            and not meta.get("storage_transformers")
            and enc.get("name") == "default"
            and separator in ("/", ".")
        )
        digests = (meta.get("attributes") or {}).get("sha256")
        if not raw or not isinstance(digests, list):
            digests = None  # written before checksums, or re-coded: its files are not ours
        elif len(digests) != math.ceil(shape[0] / chunks[0]) or not all(
            isinstance(d, str) for d in digests
        ):
            raise StoreCorruptedError(
                f"array metadata {meta_path} records {len(digests)} chunk checksums for "
                f"{math.ceil(shape[0] / chunks[0])} chunks"
            )
        sha = tuple(digests) if digests is not None else None
        return cls(path, shape, chunks[0], dt, raw=bool(raw), separator=separator, sha256=sha)

    @property
    def n_chunks(self) -> int:
        return math.ceil(self.shape[0] / self.chunk_rows)

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        return (self.chunk_rows, *self.shape[1:])

    @property
    def chunk_bytes(self) -> int:
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    def chunk_file(self, i: int) -> Path:
        parts = ["c", str(i)] + ["0"] * (len(self.shape) - 1)
        return self.path.joinpath(*parts) if self.separator == "/" else self.path / ".".join(parts)

    def size_problems(self) -> list[str]:
        """One line per chunk file that is missing or not exactly one chunk long (truncated
        by a crash or a full disk, or grown by something else); empty when all are sound.
        Costs one ``stat`` per chunk file."""
        if not self.raw:
            return []
        out = []
        for i in range(self.n_chunks):
            f = self.chunk_file(i)
            try:
                size = f.stat().st_size
            except FileNotFoundError:
                out.append(f"chunk file {f} is missing")
                continue
            if size != self.chunk_bytes:
                what = "truncated" if size < self.chunk_bytes else "too long"
                out.append(f"chunk file {f} has {size} bytes, expected {self.chunk_bytes} ({what})")
        return out

    def check_files(self) -> None:
        """Raise :class:`StoreCorruptedError` naming the first chunk file that is missing or
        not exactly one chunk long."""
        problems = self.size_problems()
        if problems:
            raise StoreCorruptedError(problems[0])

    def digest_problems(self) -> list[str]:
        """One line per chunk file whose sha256 differs from the one recorded when it was
        written (reads every byte). Files :meth:`size_problems` reports, and arrays without
        recorded checksums (:attr:`sha256` is None), are skipped."""
        if self.sha256 is None:
            return []
        out = []
        for i, want in enumerate(self.sha256):
            f = self.chunk_file(i)
            try:
                if f.stat().st_size != self.chunk_bytes:
                    continue
                got = file_sha256(f)
            except FileNotFoundError:
                continue  # a size problem
            except OSError as e:
                out.append(f"chunk file {f} cannot be read ({e})")
                continue
            if got != want:
                out.append(
                    f"chunk file {f} does not match the sha256 recorded when it was written "
                    "(same size, different bytes)"
                )
        return out

    def memmap(self, i: int, *, sparse: bool = False) -> np.ndarray:
        """Chunk ``i`` as a read-only memory map of shape :attr:`chunk_shape`; unmapped when
        the array is freed. ``sparse``: advise the kernel of random access (see
        :func:`read_around_pays`)."""
        f = self.chunk_file(i)
        dtype = self.dtype.newbyteorder("<")
        count = math.prod(self.chunk_shape)
        try:
            with open(f, "rb") as fh:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            if sparse:
                mm.madvise(mmap.MADV_RANDOM)
            return np.frombuffer(mm, dtype=dtype, count=count).reshape(self.chunk_shape)
        except (OSError, ValueError) as e:
            raise StoreCorruptedError(f"chunk file {f} cannot be read ({e})") from e

    def read_all(self) -> np.ndarray:
        """The whole array, read sequentially into one buffer.

        Each chunk file is read straight into its slice of the result: reading chunks into
        arrays of their own and concatenating them held the array twice over (an index
        snapshot of 25M keys is 200 MB of keys and 200 MB of locations).
        """
        if not self.raw:
            return np.asarray(zarr.open_array(LocalStore(self.path, read_only=True))[...])
        dtype = self.dtype.newbyteorder("<")
        n_items = math.prod(self.chunk_shape)
        flat = np.empty(self.n_chunks * n_items, dtype=dtype)
        for i in range(self.n_chunks):
            f = self.chunk_file(i)
            part = flat[i * n_items : (i + 1) * n_items]
            try:
                with open(f, "rb") as fh:
                    got = fh.readinto(part.data.cast("B"))
            except OSError as e:
                raise StoreCorruptedError(f"chunk file {f} cannot be read ({e})") from e
            if got != part.nbytes:
                raise StoreCorruptedError(
                    f"chunk file {f} holds {got} bytes, its array's metadata implies {part.nbytes}"
                )
        return flat.reshape(-1, *self.shape[1:])[: self.shape[0]].astype(self.dtype, copy=False)

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """Rows at sorted positions ``rows`` through zarr-python (the non-raw fallback)."""
        arr = zarr.open_array(LocalStore(self.path, read_only=True))
        return np.asarray(arr.get_orthogonal_selection((rows,)))

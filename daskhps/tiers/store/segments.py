"""Segments: the immutable (keys, rows) arrays of one write, and reading rows out of them.

A segment holds each of its keys once, with its row at the same offset::

    segments/<id>/keys   int64[n]            k0   k1   k2   ...
    segments/<id>/rows   float32[n, width]   r0   r1   r2   ...   (chunks of chunk_rows rows)

A *deletion record* is a segment of keys only (its group says ``"deleted": true``): replaying
it removes its keys from the index, as replaying a segment of rows puts them there. Snapshots
hold the index after it, so a deletion record is needed only until the next snapshot.

Rows are read by offset, chunk file by chunk file, through a memory map of that chunk only
(:meth:`Segment.read_into`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from daskhps.errors import StoreCorruptedError
from daskhps.tiers.store.arrays import RawArray, read_around_pays, write_array, write_group
from daskhps.tiers.store.layout import StoreFolder

__all__ = ["Segment", "is_deletion", "load_segment", "runs", "write_deletion", "write_segment"]


@dataclass(frozen=True)
class Segment:
    id: int
    keys: RawArray
    rows: RawArray | None  # None: a deletion record

    @property
    def n(self) -> int:
        return self.keys.shape[0]

    @property
    def deletes(self) -> bool:
        return self.rows is None

    def read_into(self, offsets: np.ndarray, dst: np.ndarray, out: np.ndarray) -> None:
        """``out[dst] = rows at offsets`` (ascending offsets), reading each chunk file once.

        A segment narrower than ``out`` (written before the rows had statistics) fills the
        columns it lacks with zeros."""
        assert self.rows is not None, "a deletion record holds no rows"
        w = self.rows.shape[1]
        if w < out.shape[1]:
            out[dst, w:] = 0
        if not self.rows.raw:
            out[dst, :w] = self.rows.read_rows(offsets)
            return
        cr = self.rows.chunk_rows
        row_bytes = 4 * w
        chunk = offsets // cr
        for c0, c1 in runs(chunk):
            c = int(chunk[c0])
            # A map lives for one chunk's rows only. The pages it touches (and the kernel's
            # fault-around of each) count in the process's RSS for as long as it is mapped,
            # and Dask pauses a worker on RSS: maps kept open across lookups grew a worker by
            # the size of the rows it had read, up to the whole store. Unmapped, they stay in
            # the page cache, which RSS does not count.
            sparse = not read_around_pays(c1 - c0, cr, row_bytes)
            mm = self.rows.memmap(c, sparse=sparse)
            out[dst[c0:c1], :w] = mm[offsets[c0:c1] - c * cr]
            del mm


def load_segment(folder: StoreFolder, sid: int, widths: tuple[int, ...]) -> Segment:
    """Segment ``sid`` of the store, checked against its metadata (shapes, file sizes): rows
    of one of ``widths`` floats (``RootCheck.widths``)."""
    path = folder.segment(sid)
    if not path.is_dir():
        raise StoreCorruptedError(f"segment folder {path} is missing")
    keys = RawArray.load(path / "keys", np.int64)
    if is_deletion(path):
        if len(keys.shape) != 1:
            raise StoreCorruptedError(f"deletion record {path} holds keys {keys.shape}")
        keys.check_files()
        return Segment(sid, keys, None)
    rows = RawArray.load(path / "rows", np.float32)
    if len(keys.shape) != 1 or rows.shape not in [(keys.shape[0], w) for w in widths]:
        raise StoreCorruptedError(
            f"segment {path} holds keys {keys.shape} and rows {rows.shape}, expected "
            f"[n] and [n, {' or '.join(map(str, widths))}]"
        )
    keys.check_files()
    rows.check_files()
    return Segment(sid, keys, rows)


def write_segment(
    folder: StoreFolder, sid: int, keys: torch.Tensor, rows: torch.Tensor, chunk_rows: int
) -> Segment:
    """Write a new segment (not yet fsynced); a failed write leaves no folder behind."""
    path = folder.segment(sid)
    try:
        write_group(path, {"rows": int(keys.shape[0])})
        return Segment(
            sid,
            write_array(path / "keys", keys.numpy(), chunk_rows),
            write_array(path / "rows", rows.numpy(), chunk_rows),
        )
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def write_deletion(folder: StoreFolder, sid: int, keys: torch.Tensor, chunk_rows: int) -> Segment:
    """Write a new deletion record of ``keys`` (not yet fsynced); a failed write leaves no
    folder behind."""
    path = folder.segment(sid)
    try:
        write_group(path, {"rows": int(keys.shape[0]), "deleted": True})
        return Segment(sid, write_array(path / "keys", keys.numpy(), chunk_rows), None)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def is_deletion(path: Path) -> bool:
    """Whether the segment folder ``path`` is a deletion record (from its group metadata;
    a segment without one, as some tools leave them, holds rows)."""
    try:
        attrs = json.loads((path / "zarr.json").read_text()).get("attributes") or {}
    except FileNotFoundError:
        return False
    except (OSError, ValueError, AttributeError) as e:
        raise StoreCorruptedError(
            f"segment metadata {path / 'zarr.json'} is unreadable ({e})"
        ) from e
    return attrs.get("deleted") is True


def runs(sorted_ids: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of equal values in a sorted array."""
    cuts = np.flatnonzero(sorted_ids[1:] != sorted_ids[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [sorted_ids.size]))
    return list(zip(starts.tolist(), ends.tolist(), strict=True))

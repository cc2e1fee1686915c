"""Where a store keeps what: its folders and files, how a row's location is encoded, and the
root metadata that says which rows the store holds.

On disk (``<id>`` and ``<seq>`` are 10-digit, zero-padded)::

    <store>/
      zarr.json                    root group; attributes["daskhps"]: format, width, layout
                                   (and narrow_width: the rows of segments from format 1)
      LOCK                         single-writer flock; holds the writer's pid
      segments/<id>/               one per upsert (zarr group; attributes {"rows": n})
          keys/   int64[n]         zarr arrays, ``bytes`` codec only: chunk files are raw
          rows/   float32[n, width]  little-endian rows
                                   (or keys only, attributes {"deleted": true}: a deletion
                                   record, one per delete)
      index/<seq>/keys, locs       full index snapshot written by commit <seq>
      attached/<seq>/<name>/       arrays commit <seq> carries beside the rows (zarr arrays;
                                   the table's counts of keys not admitted yet)
      commits/<seq>.json           commit manifest, made visible last by atomic rename

A location is ``segment id << 32 | row offset``. Segment ids and commit numbers only grow, over
everything on disk, so segments a crash left behind are never reused or read.

The root ``zarr.json`` is written last when a store is created and removed last when it is
wiped: a folder without it is a store whose creation never finished (:meth:`StoreFolder.probe`
says "absent" while it holds nothing but empty parts), never a damaged one.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from daskhps._paths import tree_bytes
from daskhps.errors import (
    StoreCorruptedError,
    StoreMismatchError,
    StoreNotFoundError,
)
from daskhps.tiers.lock import WriterLock
from daskhps.tiers.store.arrays import write_group
from daskhps.tiers.store.durable import fsync_dir, fsync_tree

__all__ = [
    "FORMAT",
    "MAX_SEGMENT_ID",
    "OFFSET_MASK",
    "DiskUsage",
    "RootCheck",
    "StoreFolder",
    "layout_of_today",
    "locations",
    "offset_of",
    "segment_dir",
    "segment_of",
    "snapshot_dir",
]

# 2: rows end with their statistics (daskhps.table.stats). A store of format 1 still opens: its
# rows read with zero statistics, and a writer upgrades its root (see StoreFolder.check_root).
# 3: segments may be deletion records (segments.py), which older daskhps would take for damaged
# segments; a store of format 2 holds none, so it opens as it is and a writer upgrades it.
FORMAT = 3
_STATS = "row_stats"  # the layout field of the statistics columns that format 2 appended

_SHIFT = 32
OFFSET_MASK = (1 << _SHIFT) - 1  # also the most rows one segment holds
MAX_SEGMENT_ID = (1 << 31) - 1  # locations stay non-negative int64

_Locs = TypeVar("_Locs", np.ndarray, torch.Tensor)


def locations(sid: int, start: int, n: int) -> torch.Tensor:
    """Locations of rows ``start, ..., start + n - 1`` of segment ``sid``."""
    return (sid << _SHIFT) + torch.arange(start, start + n, dtype=torch.int64)


def segment_of(locs: _Locs) -> _Locs:
    """The segment id of each location."""
    return locs >> _SHIFT


def offset_of(locs: _Locs) -> _Locs:
    """The row offset of each location within its segment."""
    return locs & OFFSET_MASK


def segment_dir(store: Path, sid: int) -> Path:
    """The folder of segment ``sid`` of the store at ``store``."""
    return store / "segments" / f"{sid:010d}"


def snapshot_dir(store: Path, seq: int) -> Path:
    """The folder of the index snapshot that commit ``seq`` of the store at ``store`` wrote."""
    return store / "index" / f"{seq:010d}"


@dataclass(frozen=True)
class StoreFolder:
    """The folder of one store, and the rows its root metadata must describe.

    Attributes
    ----------
    path:
        The store's folder.
    name:
        The tier's name, ``"<table>/zarr"`` by convention; every message starts with it.
    width:
        Floats per row.
    layout:
        JSON-able description of the rows (table, dim, optimizer, ...), stored at creation;
        every open must give the same.
    """

    path: Path
    name: str
    width: int
    layout: dict[str, Any]

    @property
    def segments(self) -> Path:
        return self.path / "segments"

    @property
    def index(self) -> Path:
        return self.path / "index"

    @property
    def commits(self) -> Path:
        return self.path / "commits"

    @property
    def attached_root(self) -> Path:
        return self.path / "attached"

    def attached(self, seq: int) -> Path:
        """The folder of the arrays that commit ``seq`` attached."""
        return self.attached_root / f"{seq:010d}"

    def attached_seqs(self) -> list[int]:
        """Commit numbers of the attached-array folders on disk."""
        return _ids(self.attached_root)

    def segment(self, sid: int) -> Path:
        return segment_dir(self.path, sid)

    def snapshot(self, seq: int) -> Path:
        return snapshot_dir(self.path, seq)

    def segment_ids(self) -> list[int]:
        """Ids of the segment folders on disk, whether or not any commit uses them."""
        return _ids(self.segments)

    def snapshot_seqs(self) -> list[int]:
        """Commit numbers of the index snapshots on disk."""
        return _ids(self.index)

    # -- the root: what is there, creating and wiping ----------------------------------------

    def probe(self) -> Literal["absent", "store", "foreign"]:
        """``"store"`` when the root metadata is there; ``"absent"`` when the path is missing,
        empty, or holds only the empty parts of a store whose creation never finished;
        ``"foreign"`` for anything else."""
        if not self.path.exists():
            return "absent"
        if not self.path.is_dir():
            return "foreign"
        entries = set(os.listdir(self.path)) - {WriterLock.FILE}
        if "zarr.json" in entries:
            return "store"
        return "absent" if all(self._skeleton(e) for e in entries) else "foreign"

    def _skeleton(self, entry: str) -> bool:
        """Whether ``entry`` is an empty part of a store whose creation never finished."""
        p = self.path / entry
        if entry == "zarr.json.tmp":
            return True
        if entry not in ("segments", "index", "commits") or not p.is_dir():
            return False
        return set(os.listdir(p)) <= {"zarr.json", "zarr.json.tmp"}

    def missing(self) -> StoreNotFoundError:
        """What opening an absent store for reading raises."""
        return StoreNotFoundError(
            f"{self.name}: {self.path}: no store there; create one with mode='w' (or mode='a', "
            f"which creates it when missing), or check the path"
        )

    def not_a_store(self) -> StoreCorruptedError:
        """What opening a foreign folder raises (creating one over it is refused elsewhere)."""
        return StoreCorruptedError(
            f"{self.name}: {self.path}: zarr.json (the store metadata) is missing, so this is no "
            f"store or a damaged one; restore it from a backup or create a new store with "
            f"mode='w'"
        )

    def create(self) -> None:
        """Write an empty store's folders and root metadata, durably."""
        write_group(self.segments)
        write_group(self.index)
        self.commits.mkdir(exist_ok=True)
        attrs = {"daskhps": {"format": FORMAT, "width": self.width, "layout": self.layout}}
        # The root zarr.json goes last: a folder without it is still "absent" to probe.
        write_group(self.path, attrs)
        fsync_tree(self.path)
        if self.path.parent != self.path:
            fsync_dir(self.path.parent)

    def wipe(self) -> None:
        """Delete everything in the store but its lock."""
        # Commits go first and the root metadata last, so a crash part-way leaves a store
        # that opens empty (or is recognised as a half-made one), never a damaged one.
        entries = sorted(set(os.listdir(self.path)) - {WriterLock.FILE, "commits", "zarr.json"})
        for entry in ["commits", *entries, "zarr.json"]:
            p = self.path / entry
            if p.is_dir():
                shutil.rmtree(p)
                fsync_dir(self.path)
            elif p.exists():
                p.unlink()
        fsync_dir(self.path)

    def check_root(self) -> RootCheck:
        """Refuse a store of a newer format, or one whose rows are not ``width`` floats of
        ``layout`` (naming every field that differs).

        A store of format 1 predates the rows' statistics: its layout lacks ``row_stats`` and
        its rows are that much narrower. It opens with the layout of today, its rows reading
        zero statistics (:attr:`RootCheck.narrow_width`); :meth:`upgrade_root` (a writer's)
        records the new layout, after which only rows written later are full width.
        """
        meta_path = self.path / "zarr.json"
        try:
            attrs = json.loads(meta_path.read_text())["attributes"]["daskhps"]
            stored_format, stored_width = int(attrs["format"]), int(attrs["width"])
            stored_layout = attrs["layout"]
            narrow = int(attrs.get("narrow_width", stored_width))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StoreCorruptedError(
                f"{self.name}: store metadata {meta_path} is damaged or is not a daskhps "
                f"store's ({e!r}); restore it from a backup or create a new store"
            ) from e
        if stored_format > FORMAT:
            raise StoreMismatchError(
                f"{self.name}: {self.path} has store format {stored_format}, newer than this "
                f"daskhps reads ({FORMAT}); upgrade daskhps"
            )
        if stored_format == 1:
            # Compared as if written today: the same rows, and the statistics after them.
            today = layout_of_today(stored_layout, self.layout)
            if today is not stored_layout:  # rows without statistics: they read as zeros
                narrow = stored_width
                stored_width += len(today[_STATS])
            stored_layout = today
        diffs = []
        if stored_width != self.width:
            diffs.append(f"width: stored {stored_width}, given {self.width}")
        for k in sorted(set(stored_layout) | set(self.layout), key=str):
            a, b = stored_layout.get(k, "<absent>"), self.layout.get(k, "<absent>")
            if a != b:
                diffs.append(f"{k}: stored {a!r}, given {b!r}")
        if diffs:
            raise StoreMismatchError(
                f"{self.name}: {self.path} holds rows of another layout ({'; '.join(diffs)}); "
                f"open it with the layout it was written with, or write this table to a new "
                f"store (mode='w', another path)"
            )
        return RootCheck(narrow, upgrade=stored_format < FORMAT)

    def upgrade_root(self, check: RootCheck) -> None:
        """Record today's format and layout in the root of an older store (a writer's step,
        before it writes a row): rows of segments written before stay ``narrow_width``."""
        if not check.upgrade:
            return
        attrs: dict[str, Any] = {"format": FORMAT, "width": self.width, "layout": self.layout}
        if check.narrow_width != self.width:
            attrs["narrow_width"] = check.narrow_width
        write_group(self.path, {"daskhps": attrs}, durable=True)  # replaces it atomically
        fsync_dir(self.path)


def layout_of_today(stored: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """A layout recorded before rows had statistics (a format 1 store, a checkpoint of its
    time), as today's: the ``row_stats`` that ``given`` has appended, and its ``width`` grown
    by as many columns. Any other layout is returned as it is."""
    stats = given.get(_STATS)
    if _STATS in stored or not isinstance(stats, list):
        return stored
    today = {**stored, _STATS: stats}
    if isinstance(stored.get("width"), int):
        today["width"] = stored["width"] + len(stats)
    return today


@dataclass(frozen=True)
class RootCheck:
    """What :meth:`StoreFolder.check_root` found: ``narrow_width``, the width of rows in
    segments written before their statistics existed (``width`` in a store without any), and
    whether the root is of an older format that a writer must upgrade."""

    narrow_width: int
    upgrade: bool = False

    def widths(self, width: int) -> tuple[int, ...]:
        """The row widths a segment of this store may have."""
        return (width,) if self.narrow_width == width else (width, self.narrow_width)


class DiskUsage:
    """Bytes of a store's files, without walking every chunk file on every call.

    Segments and snapshots are written whole and never changed after, so each folder's size
    is walked once and remembered, keyed by its name, inode and modification time (a folder
    deleted and made again, by this process or a writer elsewhere, is walked again). The rest
    of the store (metadata, manifests) is walked each time; it holds a few files. ``stats`` is
    polled every pass and by the dashboard: its cost follows the number of segments, not the
    number of chunk files, which grows with the table.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._folder_bytes: dict[tuple[str, int, int], int] = {}

    def total(self) -> int:
        total = 0
        sizes: dict[tuple[str, int, int], int] = {}
        for entry in os.scandir(self.path):
            if entry.name not in ("segments", "index") or not entry.is_dir():
                total += tree_bytes(entry.path)
                continue
            for sub in os.scandir(entry.path):
                if not sub.is_dir():
                    total += sub.stat().st_size
                    continue
                key = (sub.path, sub.inode(), sub.stat().st_mtime_ns)
                size = self._folder_bytes.get(key)
                if size is None:
                    size = tree_bytes(sub.path)
                sizes[key] = size
                total += size
        self._folder_bytes = sizes  # folders gone since are forgotten
        return total


def _ids(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return [int(e) for e in os.listdir(folder) if e.isdigit()]

"""The persistent bottom tier: one shard of one table in an append-only zarr v3 store.

Every :meth:`ZarrStore.upsert` appends one immutable *segment* (rows written together sit
together); nothing on disk is modified in place, so any earlier *commit* can be reopened and a
crash never damages committed state. The key -> location index lives in memory; commits
persist it as full snapshots every few commits and otherwise as the list of segments to replay,
so a commit costs what was written since the previous one, not the table size.

On disk (``<id>`` and ``<seq>`` are 10-digit, zero-padded)::

    <store>/
      zarr.json                    root group; attributes["daskhps"]: format, width, layout
      LOCK                         single-writer flock; holds the writer's pid
      segments/<id>/               one per upsert (zarr group; attributes {"rows": n})
          keys/   int64[n]         zarr arrays, ``bytes`` codec only: chunk files are raw
          rows/   float32[n, width]  little-endian rows
      index/<seq>/keys, locs       full index snapshot written by commit <seq>
      commits/<seq>.json           commit manifest, made visible last by atomic rename

A location is ``segment id << 32 | row offset``. The state of a commit is its snapshot plus the
replay of its segments' key arrays in order (later wins). Segment ids and commit numbers only
grow, over everything on disk, so segments a crash left behind are never reused or read.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from daskhps._paths import tree_bytes
from daskhps.errors import (
    CommitNotFoundError,
    ConfigError,
    DataError,
    StoreCorruptedError,
    StoreExistsError,
    StoreMismatchError,
    StoreNotFoundError,
    StoreReadOnlyError,
    UnwritablePathError,
)
from daskhps.tiers._index import KeyIndex
from daskhps.tiers._lock import WriterLock
from daskhps.tiers.base import (
    CommitInfo,
    CompactReport,
    Lookup,
    PersistentStore,
    TierStats,
    check_keys,
    check_rows,
)
from daskhps.tiers.store.arrays import RawArray, read_around_pays, write_array, write_group
from daskhps.tiers.store.durable import fsync_dir, fsync_tree
from daskhps.tiers.store.manifest import (
    Manifest,
    manifest_path,
    scan_manifests,
    write_manifest,
)

__all__ = ["ZarrStore"]

FORMAT = 1
Mode = Literal["w", "a", "r+", "r"]

_SHIFT = 32
_OFFSET_MASK = (1 << _SHIFT) - 1
_MAX_SEGMENT_ID = (1 << 31) - 1  # locations stay non-negative int64
_SNAPSHOT_CHUNK_ROWS = 1 << 20


@dataclass(frozen=True)
class _Segment:
    id: int
    keys: RawArray
    rows: RawArray

    @property
    def n(self) -> int:
        return self.keys.shape[0]


@dataclass
class _Chain:
    """How the live state is rebuilt: snapshot, then the replay segments in order."""

    snapshot: int | None = None
    replay: list[int] = field(default_factory=list)
    refs: set[int] = field(default_factory=set)  # every segment the state reads rows from
    since_snapshot: int = 0
    force_snapshot: bool = False

    @classmethod
    def of(cls, m: Manifest) -> _Chain:
        return cls(m.snapshot, list(m.replay), set(m.segments), m.since_snapshot)


class ZarrStore(PersistentStore):
    """The complete persistent copy of one shard of one table.

    Parameters
    ----------
    path:
        The store's folder.
    name:
        The tier's name, ``"<table>/zarr"`` by convention; every message starts with it.
    width:
        Floats per row.
    layout:
        JSON-able description of the rows (table, dim, optimizer, ...). It is stored at
        creation and must match on every reopen.
    mode:
        ``"w"`` create (an existing store is an error unless ``overwrite``); ``"a"`` open for
        writing, creating the store if the path is missing or empty; ``"r+"`` open an existing
        store for writing; ``"r"`` read-only (no lock, never writes).
    commit:
        Open the state of this commit instead of the latest one. Writers continue from it;
        later commits stay on disk (and openable) until :meth:`drop_commits`.
    snapshot_every:
        Commits between full index snapshots; in between a commit records only the segments
        written since, and opening replays them.
    chunk_rows:
        Rows per chunk file of new segments.
    overwrite:
        With ``mode="w"``, replace an existing store.
    write_buffer_rows:
        Small upserts (evictions in the middle of a pass) collect in an open segment in memory,
        written out once it holds this many rows, or at :meth:`flush` / :meth:`commit`: one
        zarr array per eviction batch would cost milliseconds each and scatter a pass's rows
        over hundreds of tiny files. Lookups read the open segment like any other.

    Notes
    -----
    Writes since the last :meth:`commit` are on disk but in no commit: reopening (or a
    crash) returns to the last commit.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        name: str,
        width: int,
        layout: dict[str, Any],
        mode: Mode = "a",
        commit: str | None = None,
        snapshot_every: int = 8,
        chunk_rows: int = 65536,
        overwrite: bool = False,
        write_buffer_rows: int = 65536,
    ) -> None:
        self.path = Path(path)
        self.name = name
        self.width = int(width)
        self.device = torch.device("cpu")
        where = f"{self.name}: opening {self.path}"
        if mode not in ("w", "a", "r+", "r"):
            raise ConfigError(f"{where}: mode must be 'w', 'a', 'r+' or 'r', got {mode!r}")
        for label, v in (("width", width), ("snapshot_every", snapshot_every)):
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{where}: {label} must be a positive integer, got {v!r}")
        if not isinstance(write_buffer_rows, int) or write_buffer_rows < 0:
            raise ConfigError(
                f"{where}: write_buffer_rows must be an integer >= 0, got {write_buffer_rows!r}"
            )
        if not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise ConfigError(f"{where}: chunk_rows must be a positive integer, got {chunk_rows!r}")
        try:
            self.layout: dict[str, Any] = json.loads(json.dumps(layout))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: layout must be a JSON-able dict ({e})") from e
        if not isinstance(self.layout, dict):
            raise ConfigError(f"{where}: layout must be a dict, got {type(layout).__name__}")
        if "width" in self.layout and self.layout["width"] != self.width:
            raise ConfigError(
                f"{where}: layout says width {self.layout['width']} but width={width} was given"
            )
        if mode == "w" and commit is not None:
            raise ConfigError(f"{where}: mode='w' creates a new store, which has no commit")
        self.mode: Mode = mode
        self._snapshot_every = snapshot_every
        self._chunk_rows = chunk_rows
        self._lock = None if mode == "r" else WriterLock(self.path, f"store of {self.name}")
        self._segments: dict[int, _Segment] = {}
        self._folder_bytes: dict[tuple[str, int, int], int] = {}  # see _disk_bytes
        self._manifests: list[Manifest] = []
        self._damaged: dict[int, tuple[Path, str]] = {}
        self._chain = _Chain()
        self._unsynced: set[int] = set()
        self._next_segment = 1
        self._next_seq = 1
        self._stats = TierStats()
        self._index = KeyIndex(1024)
        # The open segment: its id is allocated when its first row arrives, so ids stay in
        # write order and replaying segments by id reproduces the index.
        self._buf_cap = write_buffer_rows
        self._buf_sid: int | None = None
        self._buf_n = 0
        self._buf_keys = np.empty(0, dtype=np.int64)
        self._buf_rows = np.empty((0, self.width), dtype=np.float32)
        try:
            self._open(commit, overwrite)
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        name: str,
        width: int,
        layout: dict[str, Any],
        mode: Mode = "a",
        commit: str | None = None,
        snapshot_every: int = 8,
        chunk_rows: int = 65536,
        overwrite: bool = False,
        write_buffer_rows: int = 65536,
    ) -> ZarrStore:
        """Open (or create) a store; see the class docstring for the arguments."""
        return cls(
            path,
            name=name,
            width=width,
            layout=layout,
            mode=mode,
            commit=commit,
            snapshot_every=snapshot_every,
            chunk_rows=chunk_rows,
            overwrite=overwrite,
            write_buffer_rows=write_buffer_rows,
        )

    # -- opening -------------------------------------------------------------------------

    def _open(self, commit: str | None, overwrite: bool) -> None:
        state = self._probe()
        where = f"{self.name}: {self.path}"
        if state == "foreign":
            if self.mode == "w":
                raise StoreExistsError(
                    f"{where} exists and is not a daskhps store; refusing to replace it: "
                    f"choose another path or remove it yourself"
                )
            raise StoreCorruptedError(
                f"{where}: zarr.json (the store metadata) is missing, so this is no store or a "
                f"damaged one; restore it from a backup or create a new store with mode='w'"
            )
        if state == "absent":
            if self.mode in ("r", "r+"):
                raise StoreNotFoundError(
                    f"{where}: no store there; create one with mode='w' (or mode='a', which "
                    f"creates it when missing), or check the path"
                )
            if commit is not None:
                raise CommitNotFoundError(f"{where}: no store there, so no commit {commit!r}")
            try:
                self.path.mkdir(parents=True, exist_ok=True)
            except OSError as e:  # on a worker: the errno alone would not name the store
                raise UnwritablePathError(
                    f"{where}: cannot create the store's folder ({e.strerror or e}); give it a "
                    "writable path (a run's: table.tiers.store_dir)"
                ) from None
            if self._lock is not None:
                self._lock.acquire()
            # Another writer may have created the store between our look and our lock.
            if self._probe() == "absent":
                self._create()
                return
        if self.mode == "w" and not overwrite:
            raise StoreExistsError(
                f"{where}: a store already exists; open it with mode='a', or pass "
                f"overwrite=True to replace it (its rows are deleted)"
            )
        if self._lock is not None:
            self._lock.acquire()
        self._check_root()
        if self.mode == "w":
            self._wipe()
            self._create()
            return
        self._manifests, self._damaged = scan_manifests(self.path / "commits")
        self._load(self._choose(commit))
        on_disk = self._ids(self.path / "segments")
        referenced = [i for m in self._manifests for i in m.segments]
        self._next_segment = max([0, *on_disk, *referenced]) + 1
        seqs = [*self._damaged, *(m.seq for m in self._manifests), *self._ids(self.path / "index")]
        self._next_seq = max([0, *seqs]) + 1

    def _probe(self) -> Literal["absent", "store", "foreign"]:
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

    def _create(self) -> None:
        write_group(self.path / "segments")
        write_group(self.path / "index")
        (self.path / "commits").mkdir(exist_ok=True)
        attrs = {"daskhps": {"format": FORMAT, "width": self.width, "layout": self.layout}}
        # The root zarr.json goes last: a folder without it is still "absent" to _probe.
        write_group(self.path, attrs)
        fsync_tree(self.path)
        if self.path.parent != self.path:
            fsync_dir(self.path.parent)

    def _wipe(self) -> None:
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

    def _check_root(self) -> None:
        meta_path = self.path / "zarr.json"
        try:
            attrs = json.loads(meta_path.read_text())["attributes"]["daskhps"]
            stored_format, stored_width = int(attrs["format"]), int(attrs["width"])
            stored_layout = attrs["layout"]
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

    def _choose(self, commit: str | None) -> Manifest | None:
        names = [m.name for m in self._manifests]
        if commit is not None:
            for m in reversed(self._manifests):
                if m.name == commit:
                    return m
            damaged = f"; damaged manifests: {self._damaged_list()}" if self._damaged else ""
            raise CommitNotFoundError(
                f"{self.name}: {self.path} has no commit {commit!r}; available: "
                f"{names or 'none'}{damaged}"
            )
        newest_damaged = max(self._damaged, default=0)
        if newest_damaged > max((m.seq for m in self._manifests), default=0):
            path, why = self._damaged[newest_damaged]
            raise StoreCorruptedError(
                f"{self.name}: the newest commit manifest {path} is damaged ({why}); "
                f"{self._earlier_hint(newest_damaged)}"
            )
        return self._manifests[-1] if self._manifests else None

    def _load(self, m: Manifest | None) -> None:
        if m is None:
            return
        try:
            for sid in m.segments:
                self._segments[sid] = self._load_segment(sid)
            index = KeyIndex(max(1024, m.rows))
            if m.snapshot is not None:
                folder = self._snapshot_dir(m.snapshot)
                if not folder.is_dir():
                    raise StoreCorruptedError(f"index snapshot {folder} is missing")
                keys_a = RawArray.load(folder / "keys", np.int64)
                locs_a = RawArray.load(folder / "locs", np.int64)
                for a in (keys_a, locs_a):
                    a.check_files()
                snap_keys, snap_locs = keys_a.read_all(), locs_a.read_all()
                if snap_keys.shape != snap_locs.shape:
                    raise StoreCorruptedError(f"index snapshot {folder}: keys and locs differ")
                index.put(torch.from_numpy(snap_keys), torch.from_numpy(snap_locs))
            for sid in m.replay:
                seg = self._segments[sid]
                keys = torch.from_numpy(seg.keys.read_all())
                index.put(keys, (sid << _SHIFT) + torch.arange(seg.n, dtype=torch.int64))
            if len(index) != m.rows:
                raise StoreCorruptedError(
                    f"manifest {m.path} records {m.rows} keys but its segments hold {len(index)}"
                )
        except StoreCorruptedError as e:
            raise StoreCorruptedError(
                f"{self.name}: cannot open commit {m.name!r} of {self.path}: {e}; "
                f"{self._earlier_hint(m.seq)}"
            ) from e
        self._index = index
        self._chain = _Chain.of(m)

    def _load_segment(self, sid: int) -> _Segment:
        folder = self._segment_dir(sid)
        if not folder.is_dir():
            raise StoreCorruptedError(f"segment folder {folder} is missing")
        keys = RawArray.load(folder / "keys", np.int64)
        rows = RawArray.load(folder / "rows", np.float32)
        if len(keys.shape) != 1 or rows.shape != (keys.shape[0], self.width):
            raise StoreCorruptedError(
                f"segment {folder} holds keys {keys.shape} and rows {rows.shape}, expected "
                f"[n] and [n, {self.width}]"
            )
        keys.check_files()
        rows.check_files()
        return _Segment(sid, keys, rows)

    def _earlier_hint(self, seq: int) -> str:
        earlier = [m.name for m in self._manifests if m.seq < seq]
        if earlier:
            # Said for both audiences: the Python API opens a commit by name, the commands
            # pick the checkpoint of that name.
            return (
                f"earlier commits, which may be intact: {earlier}; use one of those (on the "
                "command line: --checkpoint NAME; `daskhps inspect RUN_DIR` says which "
                "checkpoints are intact) or restore the store from a backup"
            )
        return "no earlier commit exists; restore the store from a backup"

    def _damaged_list(self) -> list[str]:
        return [str(p) for p, _ in self._damaged.values()]

    # -- paths ---------------------------------------------------------------------------

    def _segment_dir(self, sid: int) -> Path:
        return self.path / "segments" / f"{sid:010d}"

    def _snapshot_dir(self, seq: int) -> Path:
        return self.path / "index" / f"{seq:010d}"

    @staticmethod
    def _ids(folder: Path) -> list[int]:
        if not folder.is_dir():
            return []
        return [int(e) for e in os.listdir(folder) if e.isdigit()]

    # -- the Tier interface ----------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        """True when opened with ``mode="r"`` (or closed): writes raise."""
        return self._lock is None or not self._lock.held

    def lookup(self, keys: torch.Tensor, *, out: torch.Tensor | None = None) -> Lookup:
        where = f"{self.name}: lookup"
        keys = check_keys(keys, where).cpu()
        n = int(keys.shape[0])
        if out is None:
            out = torch.empty(n, self.width, dtype=torch.float32)
        elif (
            out.dtype != torch.float32
            or tuple(out.shape) != (n, self.width)
            or out.device.type != "cpu"
            or not out.is_contiguous()
        ):
            raise DataError(
                f"{where}: out must be a contiguous float32 CPU tensor of shape [{n}, "
                f"{self.width}], got {out.dtype} {tuple(out.shape)} on {out.device}"
            )
        if n == 0:
            return Lookup(out, torch.zeros(0, dtype=torch.bool))
        locs, found = self._index.get(keys)
        found = found.cpu()
        found_np = found.numpy()
        out_np = out.numpy()
        hit = np.flatnonzero(found_np)
        if hit.size < n:
            out_np[~found_np] = 0
        if hit.size:
            self._gather(locs.cpu().numpy()[hit], hit, out_np)
        self._stats.lookups += n
        self._stats.hits += int(hit.size)
        self._stats.rows_read += int(hit.size)
        return Lookup(out, found)

    def _gather(self, locs: np.ndarray, dst: np.ndarray, out: np.ndarray) -> None:
        """``out[dst] = rows at locs``, reading each chunk file once, in offset order."""
        order = np.argsort(locs)
        locs, dst = locs[order], dst[order]
        seg_of = locs >> _SHIFT
        offset = locs & _OFFSET_MASK
        for a, b in _runs(seg_of):
            sid = int(seg_of[a])
            off, to = offset[a:b], dst[a:b]
            if sid == self._buf_sid:
                out[to] = self._buf_rows[off]
                continue
            seg = self._segments[sid]
            if not seg.rows.raw:
                out[to] = seg.rows.read_rows(off)
                continue
            cr = seg.rows.chunk_rows
            chunk = off // cr
            for c0, c1 in _runs(chunk):
                c = int(chunk[c0])
                # A map lives for one chunk's rows only. The pages it touches (and the
                # kernel's fault-around of each) count in the process's RSS for as long as
                # it is mapped, and Dask pauses a worker on RSS: maps kept open across
                # lookups grew a worker by the size of the rows it had read, up to the whole
                # store. Unmapped, they stay in the page cache, which RSS does not count.
                sparse = not read_around_pays(c1 - c0, cr, 4 * self.width)
                mm = seg.rows.memmap(c, sparse=sparse)
                out[to[c0:c1]] = mm[off[c0:c1] - c * cr]
                del mm

    def upsert(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Append one segment holding ``rows``."""
        where = f"{self.name}: upsert"
        self._check_writable("upsert")
        keys = check_keys(keys, where)
        rows = check_rows(rows, int(keys.shape[0]), self.width, where)
        n = int(keys.shape[0])
        if n == 0:
            return
        keys = keys.cpu().contiguous()
        if int(torch.unique(keys).numel()) != n:
            raise DataError(f"{where}: keys contain duplicates; upsert each key once per call")
        locs, existed = self._index.get(keys)
        if n >= self._buf_cap:
            self._seal()  # keep segment ids in write order
            self._append(keys, rows.cpu().contiguous())
        else:
            self._buffer(keys, rows.cpu(), locs.cpu())
        self._stats.inserts += n - int(existed.sum())
        self._stats.rows_written += n

    def _new_segment_id(self) -> int:
        sid = self._next_segment
        if sid > _MAX_SEGMENT_ID:
            raise DataError(f"{self.name}: {self.path} ran out of segment ids; run compact()")
        self._next_segment += 1  # burnt even if the write fails: ids are never reused
        return sid

    def _buffer(self, keys: torch.Tensor, rows: torch.Tensor, locs: torch.Tensor) -> None:
        """Put rows into the open segment, sealing it first if they would not fit.

        Keys already in the open segment are overwritten there: a segment holds each key
        once, which replaying its key array relies on.
        """
        if self._buf_sid is not None:
            here = (locs >> _SHIFT) == self._buf_sid
            if bool(here.any()):
                self._buf_rows[(locs[here] & _OFFSET_MASK).numpy()] = rows[here].numpy()
                keys, rows = keys[~here], rows[~here]
        n = int(keys.shape[0])
        if n == 0:
            return
        if self._buf_sid is not None and self._buf_n + n > self._buf_cap:
            self._seal()
        if self._buf_sid is None:
            self._buf_sid = self._new_segment_id()
            if self._buf_keys.shape[0] < self._buf_cap:
                self._buf_keys = np.empty(self._buf_cap, dtype=np.int64)
                self._buf_rows = np.empty((self._buf_cap, self.width), dtype=np.float32)
        a = self._buf_n
        self._buf_keys[a : a + n] = keys.numpy()
        self._buf_rows[a : a + n] = rows.numpy()
        self._index.put(keys, (self._buf_sid << _SHIFT) + torch.arange(a, a + n))
        self._buf_n += n

    def _seal(self) -> None:
        """Write the open segment to disk (under the id its rows are indexed by)."""
        if self._buf_sid is None:
            return
        n = self._buf_n
        keys = torch.from_numpy(self._buf_keys[:n])
        rows = torch.from_numpy(self._buf_rows[:n])
        self._write_segment(self._buf_sid, keys, rows)  # on failure the rows stay buffered
        self._buf_sid, self._buf_n = None, 0

    def _append(self, keys: torch.Tensor, rows: torch.Tensor) -> int:
        n = int(keys.shape[0])
        if n > _OFFSET_MASK:
            raise DataError(f"{self.name}: upsert at most {_OFFSET_MASK} rows per call, got {n}")
        sid = self._new_segment_id()
        self._write_segment(sid, keys, rows)
        self._index.put(keys, (sid << _SHIFT) + torch.arange(n, dtype=torch.int64))
        return sid

    def _write_segment(self, sid: int, keys: torch.Tensor, rows: torch.Tensor) -> None:
        n = int(keys.shape[0])
        folder = self._segment_dir(sid)
        try:
            write_group(folder, {"rows": n})
            seg = _Segment(
                sid,
                write_array(folder / "keys", keys.numpy(), self._chunk_rows),
                write_array(folder / "rows", rows.numpy(), self._chunk_rows),
            )
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._segments[sid] = seg
        self._chain.replay.append(sid)
        self._chain.refs.add(sid)
        self._unsynced.add(sid)

    def flush(self) -> None:
        """Write the open segment and make every segment durable (fsync)."""
        if not self.read_only:
            self._seal()
        self._sync_segments()

    def keys(self) -> torch.Tensor:
        return self._index.items()[0]

    def contains(self, keys: torch.Tensor) -> torch.Tensor:
        """``bool[n]``: whether each key has a row here (the index only; no row is read)."""
        keys = check_keys(keys, f"{self.name}: contains").cpu()
        return self._index.get(keys)[1].cpu()

    def __len__(self) -> int:
        return len(self._index)

    @property
    def stats(self) -> TierStats:
        live_rows = sum(self._segments[s].n for s in self._chain.refs if s in self._segments)
        self._stats.extra = {
            "segments": float(len(self._chain.refs)),
            "bytes_on_disk": float(self._disk_bytes()),
            "stale_fraction": 1.0 - len(self) / live_rows if live_rows else 0.0,
            "commits": float(len(self._manifests)),
            "index_bytes": float(self._index.nbytes),
        }
        return self._stats

    def _disk_bytes(self) -> int:
        """Bytes of the store's files, without walking every chunk file on every call.

        Segments and snapshots are written whole and never changed after, so each folder's
        size is walked once and remembered, keyed by its name, inode and modification time (a
        folder deleted and made again, by this process or a writer elsewhere, is walked
        again). The rest of the store (metadata, manifests) is walked each time; it holds a
        few files. ``stats`` is polled every pass and by the dashboard: its cost follows the
        number of segments, not the number of chunk files, which grows with the table.
        """
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

    def close(self) -> None:
        """Release the writer lock. Uncommitted writes are not committed."""
        self._buf_sid, self._buf_n = None, 0  # uncommitted rows are dropped, as in a crash
        if self._lock is not None:
            self._lock.release()

    # -- commits ---------------------------------------------------------------------------

    def commit(self, name: str, meta: dict[str, Any] | None = None) -> CommitInfo:
        """Make everything written so far durable and name the state ``name``.

        The manifest is written last, by atomic rename: a crash before it leaves the previous
        commit as the latest. Committing an existing name replaces that commit.
        """
        where = f"{self.name}: commit {name!r}"
        self._check_writable("commit")
        if not isinstance(name, str) or not name.strip():
            raise DataError(f"{where}: the name must be a non-empty string")
        try:
            meta_copy = json.loads(json.dumps({} if meta is None else meta))
        except (TypeError, ValueError) as e:
            raise DataError(f"{where}: meta must be a JSON-able dict ({e})") from e
        if not isinstance(meta_copy, dict):
            raise DataError(f"{where}: meta must be a dict, got {type(meta).__name__}")
        self._seal()
        self._sync_segments()
        seq = self._next_seq
        self._next_seq += 1
        chain = self._chain
        replay_rows = sum(self._segments[s].n for s in chain.replay if s in self._segments)
        write_snapshot = (
            chain.force_snapshot
            or chain.since_snapshot + 1 >= self._snapshot_every
            # Replaying more keys than a snapshot holds would make opening slower than loading one.
            or replay_rows > 2 * len(self._index)
        )
        if write_snapshot:
            self._write_snapshot(seq)
        else:
            chain.since_snapshot += 1
        m = Manifest(
            path=manifest_path(self.path / "commits", seq),
            seq=seq,
            name=name,
            time=time.time(),
            meta=meta_copy,
            snapshot=self._chain.snapshot,
            replay=list(self._chain.replay),
            segments=sorted(self._chain.refs),
            rows=len(self._index),
            since_snapshot=self._chain.since_snapshot,
            wrote_snapshot=write_snapshot,
        )
        write_manifest(self.path / "commits", m)
        superseded = [old for old in self._manifests if old.name == name]
        for old in superseded:
            old.path.unlink(missing_ok=True)
        if superseded:
            fsync_dir(self.path / "commits")
        self._manifests = [old for old in self._manifests if old.name != name] + [m]
        return m.info

    def _write_snapshot(self, seq: int) -> None:
        keys, locs = self._index.items()
        keys_np, locs_np = keys.cpu().numpy(), locs.cpu().numpy()
        refs = {int(s) for s in np.unique(locs_np >> _SHIFT)}
        folder = self._snapshot_dir(seq)
        write_group(folder, {"rows": int(keys_np.shape[0])})
        write_array(folder / "keys", keys_np, _SNAPSHOT_CHUNK_ROWS)
        write_array(folder / "locs", locs_np, _SNAPSHOT_CHUNK_ROWS)
        fsync_tree(folder)
        fsync_dir(folder.parent)
        self._chain = _Chain(snapshot=seq, refs=refs)

    def _sync_segments(self) -> None:
        if not self._unsynced:
            return
        for sid in sorted(self._unsynced):
            if self._segment_dir(sid).is_dir():
                fsync_tree(self._segment_dir(sid))
        fsync_dir(self.path / "segments")
        self._unsynced.clear()

    def commits(self) -> list[CommitInfo]:
        """Every readable commit, oldest first."""
        return [m.info for m in self._manifests]

    # -- read-only views for readers that refresh to a newer commit ------------------------

    @property
    def segment_ids(self) -> frozenset[int]:
        """Segments the open state reads rows from. A key whose row differs between two
        commits lies in a segment that only one of them uses (segments are immutable and a
        key's row is the one of its latest segment), so diffing these sets finds a delta."""
        return frozenset(self._chain.refs)

    def segment_keys(self, ids: frozenset[int] | set[int]) -> torch.Tensor:
        """Keys held in the segments ``ids`` of this store (from :attr:`segment_ids` of this
        or another commit), concatenated; reads their key arrays only, no rows. A segment
        that no kept commit uses may have been deleted: :class:`StoreCorruptedError`."""
        parts = [np.empty(0, dtype=np.int64)]
        for sid in sorted(ids):
            seg = self._segments.get(sid) or self._load_segment(sid)
            parts.append(seg.keys.read_all())
        return torch.from_numpy(np.concatenate(parts))

    def advance(self, commit: str) -> torch.Tensor:
        """Move a read-only store to a later ``commit`` through its delta; returns the
        (unique) keys whose row may differ: those of the segments ``commit`` adds.

        Only the key arrays of the added segments (and of those it no longer uses) are
        read, and the added ones replayed over the index in memory, instead of loading the
        commit's whole index. That is exact when ``commit`` extends the open state: every
        added segment is newer than every segment the open state uses, and every key whose
        row sits in a segment ``commit`` stops using is rewritten in an added one (a
        compaction's copies).

        Raises
        ------
        StoreMismatchError
            ``commit`` does not extend the open state (an earlier commit, one written from an
            earlier commit); nothing changed: open the store at ``commit`` instead.
        """
        if self.mode != "r":
            raise DataError(f"{self.name}: advance is for readers; open {self.path} with mode='r'")
        self._manifests, self._damaged = scan_manifests(self.path / "commits")
        m = self._choose(commit)
        assert m is not None  # _choose raises for a missing name
        old = self._chain.refs
        added, gone = sorted(set(m.segments) - old), sorted(old - set(m.segments))
        segments = {sid: self._load_segment(sid) for sid in added}
        new_keys = [segments[sid].keys.read_all() for sid in added]
        fresh = np.unique(np.concatenate([np.empty(0, np.int64), *new_keys]))
        unseen = int((~self._index.get(torch.from_numpy(fresh))[1]).sum())
        # Keys whose row sits in a dropped segment must be rewritten in an added one.
        dropped = np.concatenate(
            [np.empty(0, np.int64), *(self._segments[sid].keys.read_all() for sid in gone)]
        )
        locs, _ = self._index.get(torch.from_numpy(np.setdiff1d(dropped, fresh)))
        orphaned = bool(np.isin((locs >> _SHIFT).numpy(), np.asarray(gone, np.int64)).any())
        if (added and old and added[0] < max(old)) or orphaned or len(self) + unseen != m.rows:
            raise StoreMismatchError(
                f"{self.name}: commit {commit!r} of {self.path} does not extend the open "
                f"state; open the store at that commit instead"
            )
        for sid, keys in zip(added, new_keys, strict=True):  # id order: later segments win
            locs = (sid << _SHIFT) + torch.arange(len(keys), dtype=torch.int64)
            self._index.put(torch.from_numpy(keys), locs)
        for sid in gone:
            self._forget_segment(sid)
        self._segments.update(segments)
        self._chain = _Chain.of(m)
        return torch.from_numpy(fresh)

    @property
    def latest_commit(self) -> CommitInfo | None:
        return self._manifests[-1].info if self._manifests else None

    def drop_commits(self, keep: int) -> list[CommitInfo]:
        """Delete all but the newest ``keep`` commits and the files only they used.

        Returns the dropped commits. Readers that opened a dropped commit lose their files.
        """
        self._check_writable("drop_commits")
        self._seal()
        if not isinstance(keep, int) or keep < 1:
            raise DataError(f"{self.name}: drop_commits keeps at least 1 commit, got {keep!r}")
        everything = sorted([*(m.seq for m in self._manifests), *self._damaged])
        kept = set(everything[-keep:])
        damaged_kept = [self._damaged[s][0] for s in kept if s in self._damaged]
        if damaged_kept:
            raise StoreCorruptedError(
                f"{self.name}: kept commit manifests {damaged_kept} are damaged, so the "
                f"segments they use are unknown and nothing was deleted; remove those files "
                f"(their commits are lost anyway) and call drop_commits again"
            )
        dropped = [m for m in self._manifests if m.seq not in kept]
        for m in dropped:
            m.path.unlink(missing_ok=True)
        for s in [s for s in self._damaged if s not in kept]:
            self._damaged.pop(s)[0].unlink(missing_ok=True)
        fsync_dir(self.path / "commits")
        self._manifests = [m for m in self._manifests if m.seq in kept]
        self._collect_garbage()
        return [m.info for m in dropped]

    def compact(self, min_stale: float = 0.5, merge_below: int = 0) -> CompactReport:
        """Rewrite the live rows of segments with at least ``min_stale`` stale rows, and of
        segments with fewer than ``merge_below`` rows (many small evictions make many small
        segments), into new segments in their write order; then delete every segment and
        snapshot that no kept commit and no live row uses.

        Old segments that kept commits still use are freed once :meth:`drop_commits` drops
        those commits. The next commit writes a full index snapshot.
        """
        self._check_writable("compact")
        self._seal()
        if not 0.0 < min_stale <= 1.0:
            raise DataError(f"{self.name}: compact min_stale must be in (0, 1], got {min_stale}")
        keys, locs = self._index.items()
        keys_np, locs_np = keys.cpu().numpy(), locs.cpu().numpy()
        seg_of = locs_np >> _SHIFT
        ids, live = np.unique(seg_of, return_counts=True)
        total = np.array([self._segments[int(s)].n for s in ids], dtype=np.int64)
        small = total < merge_below
        if small.sum() < 2:  # rewriting one small segment alone merges nothing
            small[:] = False
        victims = ids[(1.0 - live / np.maximum(total, 1) >= min_stale) | small]
        moved = 0
        new_ids: list[int] = []
        if victims.size:
            pick = np.flatnonzero(np.isin(seg_of, victims))
            pick = pick[np.argsort(locs_np[pick])]  # keep rows in their write order
            step = 16 * self._chunk_rows
            for a in range(0, pick.size, step):
                part = pick[a : a + step]
                rows = np.empty((part.size, self.width), dtype=np.float32)
                self._gather(locs_np[part], np.arange(part.size), rows)
                part_keys = torch.from_numpy(keys_np[part])
                new_ids.append(self._append(part_keys, torch.from_numpy(rows)))
            moved = int(pick.size)
        gone = set(victims.tolist())
        self._chain.refs = {int(s) for s in ids.tolist() if s not in gone} | set(new_ids)
        self._chain.force_snapshot = True
        deleted, freed = self._collect_garbage()
        return CompactReport(int(victims.size), moved, deleted, freed)

    def _collect_garbage(self) -> tuple[int, int]:
        """Delete segments and snapshots that no kept commit and no live row uses."""
        # The live state needs only refs: after a compaction the replay list is stale, and the
        # next commit (a forced snapshot) does not use it.
        keep_segments = set(self._chain.refs)
        keep_snapshots = {self._chain.snapshot}
        for m in self._manifests:
            keep_segments.update(m.segments)
            keep_snapshots.add(m.snapshot)
        deleted = freed = 0
        for sid in self._ids(self.path / "segments"):
            if sid not in keep_segments:
                freed += tree_bytes(self._segment_dir(sid))
                self._forget_segment(sid)
                shutil.rmtree(self._segment_dir(sid))
                deleted += 1
        for seq in self._ids(self.path / "index"):
            if seq not in keep_snapshots:
                freed += tree_bytes(self._snapshot_dir(seq))
                shutil.rmtree(self._snapshot_dir(seq))
        fsync_dir(self.path / "segments")
        fsync_dir(self.path / "index")
        return deleted, freed

    def _forget_segment(self, sid: int) -> None:
        self._segments.pop(sid, None)
        self._unsynced.discard(sid)

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            state = "read-only (mode='r')" if self.mode == "r" else "closed"
            raise StoreReadOnlyError(
                f"{self.name}: cannot {what}: {self.path} is open {state}; reopen it with "
                f"mode='a' or 'r+' to write"
            )


def _runs(sorted_ids: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of equal values in a sorted array."""
    cuts = np.flatnonzero(sorted_ids[1:] != sorted_ids[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [sorted_ids.size]))
    return list(zip(starts.tolist(), ends.tolist(), strict=True))

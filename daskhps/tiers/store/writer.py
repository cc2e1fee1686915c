"""The writer of a store: the one process that appends to it, holding its ``LOCK``.

Everything a reader does, plus::

    upsert        small ──► write buffer (the open segment, buffer.py)
                  large ──► a segment of its own (the open segment is sealed first)
    flush         seal the open segment; fsync every segment written since
    delete        a deletion record: a segment of keys only (segments.py)
    commit        flush; the arrays it attaches, if new; an index snapshot or the segments
                  to replay (chain.py); the manifest last, by atomic rename
    compact       live rows of wasteful segments into new ones (compaction.py); garbage deleted
    drop_commits  keep the newest commits (chain.py); garbage deleted
    drop_named    delete the commits of some names, whatever their age; garbage deleted

Nothing on disk is modified in place: every write appends a segment, so any earlier commit can
be reopened and a crash never damages committed state. Writes since the last :meth:`commit`
are on disk but in no commit: reopening (or a crash) returns to the last commit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from daskhps.errors import (
    CommitNotFoundError,
    DataError,
    StoreExistsError,
    UnwritablePathError,
)
from daskhps.tiers.base import (
    Attachments,
    CommitInfo,
    CommitMeta,
    CompactReport,
    check_keys,
    check_rows,
)
from daskhps.tiers.lock import WriterLock
from daskhps.tiers.store.buffer import WriteBuffer
from daskhps.tiers.store.chain import write_attached, write_snapshot
from daskhps.tiers.store.compaction import plan_compaction
from daskhps.tiers.store.durable import fsync_dir, fsync_tree
from daskhps.tiers.store.layout import (
    MAX_SEGMENT_ID,
    OFFSET_MASK,
    RootCheck,
    StoreFolder,
    locations,
)
from daskhps.tiers.store.manifest import Manifest, manifest_path
from daskhps.tiers.store.reader import StoreReader
from daskhps.tiers.store.segments import write_deletion, write_segment

__all__ = ["StoreWriter"]

WriteMode = Literal["w", "a", "r+"]


class StoreWriter(StoreReader):
    """A store open for writing; open it with :func:`~daskhps.tiers.store.open_store`
    (``mode`` ``"w"``, ``"a"`` or ``"r+"``, whose arguments it documents). Once closed it
    refuses writes like a reader."""

    _read_only_as = "closed"

    def __init__(
        self,
        folder: StoreFolder,
        commit: str | None,
        *,
        mode: WriteMode,
        overwrite: bool,
        snapshot_every: int,
        chunk_rows: int,
        write_buffer_rows: int,
    ) -> None:
        self.mode = mode
        self._overwrite = overwrite
        self._snapshot_every = snapshot_every
        self._chunk_rows = chunk_rows
        self._lock = WriterLock(folder.path, f"store of {folder.name}")
        self._buffer = WriteBuffer(write_buffer_rows, folder.width)
        self._unsynced: set[int] = set()  # segments written and not fsynced yet
        self._next_segment = 1
        self._next_seq = 1
        super().__init__(folder, commit)

    def _open(self, commit: str | None) -> None:
        f = self.folder
        where = f"{self.name}: {self.path}"
        state = f.probe()
        if state == "foreign":
            if self.mode == "w":
                raise StoreExistsError(
                    f"{where} exists and is not a daskhps store; refusing to replace it: "
                    f"choose another path or remove it yourself"
                )
            raise f.not_a_store()
        if state == "absent":
            if self.mode == "r+":
                raise f.missing()
            if commit is not None:
                raise CommitNotFoundError(f"{where}: no store there, so no commit {commit!r}")
            try:
                self.path.mkdir(parents=True, exist_ok=True)
            except OSError as e:  # on a worker: the errno alone would not name the store
                raise UnwritablePathError(
                    f"{where}: cannot create the store's folder ({e.strerror or e}); give it a "
                    "writable path (a run's: table.tiers.store_dir)"
                ) from None
            self._lock.acquire()
            # Another writer may have created the store between our look and our lock.
            if f.probe() == "absent":
                f.create()
                return
        if self.mode == "w" and not self._overwrite:
            raise StoreExistsError(
                f"{where}: a store already exists; open it with mode='a', or pass "
                f"overwrite=True to replace it (its rows are deleted)"
            )
        self._lock.acquire()
        self._root = f.check_root()
        if self.mode == "w":
            f.wipe()
            f.create()
            self._root = RootCheck(f.width)
            return
        # An older store says so in its root before a row of today's layout is written.
        f.upgrade_root(self._root)
        self._root = RootCheck(self._root.narrow_width)
        self._load_commit(commit)
        # Ids only grow, over everything on disk: what a crash left behind is never reused.
        referenced = [i for m in self._log.manifests for i in m.segments]
        self._next_segment = max([0, *f.segment_ids(), *referenced]) + 1
        self._next_seq = max([self._log.last_seq(), *f.snapshot_seqs()]) + 1

    @property
    def read_only(self) -> bool:
        return not self._lock.held

    def close(self) -> None:
        """Release the writer lock. Uncommitted writes are not committed."""
        self._buffer.clear()  # uncommitted rows are dropped, as in a crash
        self._lock.release()

    def advance(self, commit: str) -> torch.Tensor:
        """Refused: a writer's state is ahead of its commits; readers advance."""
        raise DataError(f"{self.name}: advance is for readers; open {self.path} with mode='r'")

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            self._refuse(what)

    # -- writing rows ----------------------------------------------------------------------

    def upsert(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Write rows into the open segment, or as a segment of their own when there are at
        least ``write_buffer_rows`` of them."""
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
        if n >= self._buffer.capacity:
            self._seal()  # keep segment ids in write order
            self._append(keys, rows.cpu().contiguous())
        else:
            self._write_buffered(keys, rows.cpu(), locs.cpu())
        self._stats.inserts += n - int(existed.sum())
        self._stats.rows_written += n

    def delete(self, keys: torch.Tensor) -> int:
        """Remove the rows of unique ``keys`` (absent ones are ignored): a deletion record
        (a segment of keys only) replayed after every earlier segment. Returns how many
        rows were removed."""
        where = f"{self.name}: delete"
        self._check_writable("delete")
        keys = check_keys(keys, where).cpu().contiguous()
        if int(torch.unique(keys).numel()) != int(keys.shape[0]):
            raise DataError(f"{where}: keys contain duplicates; delete each key once per call")
        present = keys[self._index.get(keys)[1]]
        n = int(present.shape[0])
        if n == 0:
            return 0
        if n > OFFSET_MASK:
            raise DataError(f"{where}: delete at most {OFFSET_MASK} keys per call, got {n}")
        self._seal()  # rows buffered before must replay before the record, later ones after
        sid = self._new_segment_id()
        self._segments[sid] = write_deletion(self.folder, sid, present, self._chunk_rows)
        self._chain.add(sid)
        self._unsynced.add(sid)
        self._index.delete(present)
        self._stats.extra["rows_deleted"] = self._stats.extra.get("rows_deleted", 0) + n
        return n

    def _write_buffered(self, keys: torch.Tensor, rows: torch.Tensor, locs: torch.Tensor) -> None:
        """Put rows into the open segment, sealing it first if they would not fit."""
        keys, rows = self._buffer.overwrite(keys, rows, locs)
        n = int(keys.shape[0])
        if n == 0:
            return
        if self._buffer.sid is not None and not self._buffer.fits(n):
            self._seal()
        sid = self._buffer.sid
        if sid is None:
            sid = self._new_segment_id()
            self._buffer.open(sid)
        self._index.put(keys, locations(sid, self._buffer.n, n))
        self._buffer.append(keys, rows)

    def _read_segment(
        self, sid: int, offsets: np.ndarray, dst: np.ndarray, out: np.ndarray
    ) -> None:
        if sid == self._buffer.sid:
            out[dst] = self._buffer.rows_at(offsets)
        else:
            super()._read_segment(sid, offsets, dst, out)

    def _seal(self) -> None:
        """Write the open segment to disk (under the id its rows are indexed by)."""
        if self._buffer.sid is None:
            return
        keys, rows = self._buffer.contents()
        self._write_segment(self._buffer.sid, keys, rows)  # on failure the rows stay buffered
        self._buffer.clear()

    def _append(self, keys: torch.Tensor, rows: torch.Tensor) -> int:
        """Write rows as a new segment of their own; returns its id."""
        n = int(keys.shape[0])
        if n > OFFSET_MASK:
            raise DataError(f"{self.name}: upsert at most {OFFSET_MASK} rows per call, got {n}")
        sid = self._new_segment_id()
        self._write_segment(sid, keys, rows)
        self._index.put(keys, locations(sid, 0, n))
        return sid

    def _new_segment_id(self) -> int:
        sid = self._next_segment
        if sid > MAX_SEGMENT_ID:
            raise DataError(f"{self.name}: {self.path} ran out of segment ids; run compact()")
        self._next_segment += 1  # burnt even if the write fails: ids are never reused
        return sid

    def _write_segment(self, sid: int, keys: torch.Tensor, rows: torch.Tensor) -> None:
        self._segments[sid] = write_segment(self.folder, sid, keys, rows, self._chunk_rows)
        self._chain.add(sid)
        self._unsynced.add(sid)

    def flush(self) -> None:
        """Write the open segment and make every segment durable (fsync)."""
        if not self.read_only:
            self._seal()
        self._sync_segments()

    def _sync_segments(self) -> None:
        if not self._unsynced:
            return
        for sid in sorted(self._unsynced):
            if self.folder.segment(sid).is_dir():
                fsync_tree(self.folder.segment(sid))
        fsync_dir(self.folder.segments)
        self._unsynced.clear()

    # -- commits ---------------------------------------------------------------------------

    def commit(self, name: str, meta: CommitMeta = None, attach: Attachments = None) -> CommitInfo:
        """The manifest is written last, by atomic rename: a crash before it leaves the
        previous commit as the latest. ``attach``: the arrays the commit carries from now on
        (``{}``: none); None keeps those of the state it extends (see :meth:`attached`)."""
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
        if attach is not None:
            self._chain.attached = write_attached(self.folder, seq, attach) if attach else None
        replay_rows = sum(self._segments[s].n for s in self._chain.replay if s in self._segments)
        snapshot = self._chain.wants_snapshot(self._snapshot_every, replay_rows, len(self._index))
        if snapshot:
            deletions = {sid for sid in self._chain.refs if self._segments[sid].deletes}
            self._chain = write_snapshot(
                self.folder, seq, self._index, self._chain.attached, deletions
            )
        else:
            self._chain.since_snapshot += 1
        chain = self._chain
        m = Manifest(
            path=manifest_path(self.folder.commits, seq),
            seq=seq,
            name=name,
            time=time.time(),
            meta=meta_copy,
            snapshot=chain.snapshot,
            replay=list(chain.replay),
            segments=sorted(chain.refs),
            rows=len(self._index),
            since_snapshot=chain.since_snapshot,
            wrote_snapshot=snapshot,
            attached=chain.attached,
        )
        self._log.record(m)
        return m.info

    def drop_commits(self, keep: int) -> list[CommitInfo]:
        self._check_writable("drop_commits")
        self._seal()
        dropped = self._log.drop(keep)
        self._collect_garbage()
        return [m.info for m in dropped]

    def drop_named(self, names: Sequence[str]) -> list[CommitInfo]:
        """Delete the commits called ``names`` wherever they are in the history (a retention
        rule's old versions), then the files no kept commit and no live row uses. The open
        state is not a commit and stays; names not there are ignored."""
        self._check_writable("drop_named")
        self._seal()
        dropped = self._log.forget(set(names))
        self._collect_garbage()
        return [m.info for m in dropped]

    def compact(self, min_stale: float = 0.5, merge_below: int = 0) -> CompactReport:
        self._check_writable("compact")
        self._seal()
        if not 0.0 < min_stale <= 1.0:
            raise DataError(f"{self.name}: compact min_stale must be in (0, 1], got {min_stale}")
        keys, locs = self._index.items()
        keys_np, locs_np = keys.cpu().numpy(), locs.cpu().numpy()
        plan = plan_compaction(locs_np, self._segments, min_stale, merge_below)
        new_ids = []
        for part in plan.batches(self._chunk_rows):
            rows = np.empty((part.size, self.width), dtype=np.float32)
            self._gather(locs_np[part], np.arange(part.size), rows)
            new_ids.append(self._append(torch.from_numpy(keys_np[part]), torch.from_numpy(rows)))
        gone = set(plan.victims.tolist())
        self._chain.refs = {int(s) for s in plan.live.tolist() if s not in gone} | set(new_ids)
        self._chain.force_snapshot = True
        deleted, freed = self._collect_garbage()
        return CompactReport(int(plan.victims.size), int(plan.moves.size), deleted, freed)

    def _collect_garbage(self) -> tuple[int, int]:
        """Delete what no kept commit and no live row uses: (segments deleted, bytes freed)."""
        garbage = self._log.garbage(self._chain)
        for sid in garbage.segments:
            self._forget_segment(sid)
        return len(garbage.segments), garbage.delete(self.folder)

    def _forget_segment(self, sid: int) -> None:
        super()._forget_segment(sid)
        self._unsynced.discard(sid)

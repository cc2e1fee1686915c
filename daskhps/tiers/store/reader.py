"""The read-only store: one commit's rows, which readers may move to a later commit.

Opening loads the commit's key -> location index into memory (:func:`rebuild_index`) and
checks the files of every segment it reads rows from; a lookup is then one index probe per
key and one read per chunk file touched. A reader takes no lock and never writes, so a writer
may keep appending and committing meanwhile.

::

    keys ──► index (in memory) ──► locations, sorted ──► per segment, per chunk file:
                                                         memory map, copy rows, unmap
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import numpy as np
import torch

from daskhps.errors import DataError, StoreCorruptedError, StoreMismatchError, StoreReadOnlyError
from daskhps.tiers.base import (
    Attachments,
    CommitInfo,
    CommitMeta,
    CompactReport,
    Lookup,
    PersistentStore,
    TierStats,
    check_keys,
)
from daskhps.tiers.index import KeyIndex
from daskhps.tiers.store.chain import Chain, CommitLog, read_attached, rebuild_index
from daskhps.tiers.store.layout import (
    DiskUsage,
    RootCheck,
    StoreFolder,
    locations,
    offset_of,
    segment_of,
)
from daskhps.tiers.store.segments import Segment, load_segment, runs

__all__ = ["StoreReader"]


class _RefusesWrites(PersistentStore):
    """What a store opened for reading answers to every call that would change it: the
    writes of the interface, refused (a reader's flush has nothing to make durable)."""

    name: str
    path: Path
    _read_only_as = "read-only (mode='r')"  # how a refused write describes the store

    def _refuse(self, what: str) -> NoReturn:
        raise StoreReadOnlyError(
            f"{self.name}: cannot {what}: {self.path} is open {self._read_only_as}; reopen it "
            f"with mode='a' or 'r+' to write"
        )

    def upsert(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        self._refuse("upsert")

    def delete(self, keys: torch.Tensor) -> int:
        self._refuse("delete")

    def flush(self) -> None:
        """Nothing to make durable: a reader writes nothing."""

    def commit(self, name: str, meta: CommitMeta = None, attach: Attachments = None) -> CommitInfo:
        self._refuse("commit")

    def drop_commits(self, keep: int) -> list[CommitInfo]:
        self._refuse("drop_commits")

    def compact(self, min_stale: float = 0.5, merge_below: int = 0) -> CompactReport:
        self._refuse("compact")


class StoreReader(_RefusesWrites):
    """One commit of a store, read-only; open it with :func:`~daskhps.tiers.store.open_store`
    (``mode="r"``). Writes raise :class:`StoreReadOnlyError`.

    Parameters
    ----------
    folder:
        The store and the rows it must hold.
    commit:
        The commit to open; None: the latest.
    """

    def __init__(self, folder: StoreFolder, commit: str | None = None) -> None:
        self.folder = folder
        self.path, self.name, self.width = folder.path, folder.name, folder.width
        self.layout = folder.layout
        self.device = torch.device("cpu")
        self._segments: dict[int, Segment] = {}
        self._log = CommitLog(folder)
        self._chain = Chain()
        self._index = KeyIndex(1024)
        self._root = RootCheck(folder.width)  # what the root says, once opened
        self._stats = TierStats()
        self._disk = DiskUsage(folder.path)
        try:
            self._open(commit)
        except BaseException:
            self.close()
            raise

    def _open(self, commit: str | None) -> None:
        state = self.folder.probe()
        if state == "foreign":
            raise self.folder.not_a_store()
        if state == "absent":
            raise self.folder.missing()
        self._root = self.folder.check_root()
        self._load_commit(commit)

    def _load_commit(self, commit: str | None) -> None:
        """Scan the manifests and load ``commit`` (or the latest): segments, then index."""
        self._log.scan()
        m = self._log.choose(commit)
        if m is None:
            return
        try:
            for sid in m.segments:
                self._segments[sid] = load_segment(self.folder, sid, self._widths)
            index = rebuild_index(self.folder, m, self._segments)
        except StoreCorruptedError as e:
            raise StoreCorruptedError(
                f"{self.name}: cannot open commit {m.name!r} of {self.path}: {e}; "
                f"{self._log.earlier_hint(m.seq)}"
            ) from e
        self._index = index
        self._chain = Chain.of(m)

    @property
    def _widths(self) -> tuple[int, ...]:
        """The row widths this store's segments may have (narrower: from format 1)."""
        return self._root.widths(self.width)

    # -- reading ---------------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        return True

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
        seg_of = segment_of(locs)
        offset = offset_of(locs)
        for a, b in runs(seg_of):
            self._read_segment(int(seg_of[a]), offset[a:b], dst[a:b], out)

    def _read_segment(
        self, sid: int, offsets: np.ndarray, dst: np.ndarray, out: np.ndarray
    ) -> None:
        self._segments[sid].read_into(offsets, dst, out)

    def keys(self) -> torch.Tensor:
        return self._index.items()[0]

    def contains(self, keys: torch.Tensor) -> torch.Tensor:
        keys = check_keys(keys, f"{self.name}: contains").cpu()
        return self._index.get(keys)[1].cpu()

    def __len__(self) -> int:
        return len(self._index)

    @property
    def stats(self) -> TierStats:
        live_rows = sum(self._segments[s].n for s in self._chain.refs if s in self._segments)
        self._stats.extra = {
            "segments": float(len(self._chain.refs)),
            "bytes_on_disk": float(self._disk.total()),
            "stale_fraction": 1.0 - len(self) / live_rows if live_rows else 0.0,
            "commits": float(len(self._log.manifests)),
            "index_bytes": float(self._index.nbytes),
        }
        return self._stats

    def commits(self) -> list[CommitInfo]:
        return self._log.infos()

    @property
    def latest_commit(self) -> CommitInfo | None:
        """The newest readable commit when the manifests were last scanned."""
        return self._log.manifests[-1].info if self._log.manifests else None

    # -- arrays the commit carries beside its rows -------------------------------------------

    @property
    def attached_names(self) -> tuple[str, ...]:
        """Names of the arrays the open state carries (``commit(..., attach=...)``)."""
        return self._chain.attached.names if self._chain.attached else ()

    def attached(self, name: str) -> np.ndarray | None:
        """Array ``name`` the open state carries, read from disk; None when it carries none
        of that name."""
        return read_attached(self.folder, self._chain.attached, name)

    # -- moving to a later commit: what changed between two commits --------------------------

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
            seg = self._segments.get(sid) or load_segment(self.folder, sid, self._widths)
            parts.append(seg.keys.read_all())
        return torch.from_numpy(np.concatenate(parts))

    def advance(self, commit: str) -> torch.Tensor:
        """Move to a later ``commit`` through its delta; returns the (unique) keys whose row
        may differ: those of the segments ``commit`` adds (deletion records included: a
        deleted key reads as absent after).

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
        self._log.scan()
        m = self._log.choose(commit)
        assert m is not None  # choose raises for a missing name
        old = self._chain.refs
        added, gone = sorted(set(m.segments) - old), sorted(old - set(m.segments))
        segments = {sid: load_segment(self.folder, sid, self._widths) for sid in added}
        new_keys = [segments[sid].keys.read_all() for sid in added]
        fresh = np.unique(np.concatenate([np.empty(0, np.int64), *new_keys]))
        # Which of them the state holds after the added segments replay (a deletion record
        # removes its keys), to check the row count the commit records.
        held_before = self._index.get(torch.from_numpy(fresh))[1].numpy()
        held_after = held_before.copy()
        for sid, keys in zip(added, new_keys, strict=True):
            held_after[np.searchsorted(fresh, keys)] = not segments[sid].deletes
        rows_after = len(self) + int(held_after.sum()) - int(held_before.sum())
        # Keys whose row sits in a dropped segment must be rewritten in an added one.
        dropped = np.concatenate(
            [np.empty(0, np.int64), *(self._segments[sid].keys.read_all() for sid in gone)]
        )
        locs, _ = self._index.get(torch.from_numpy(np.setdiff1d(dropped, fresh)))
        orphaned = bool(np.isin(segment_of(locs).numpy(), np.asarray(gone, np.int64)).any())
        if (added and old and added[0] < max(old)) or orphaned or rows_after != m.rows:
            raise StoreMismatchError(
                f"{self.name}: commit {commit!r} of {self.path} does not extend the open "
                f"state; open the store at that commit instead"
            )
        for sid, keys in zip(added, new_keys, strict=True):  # id order: later segments win
            if segments[sid].deletes:
                self._index.delete(torch.from_numpy(keys))
            else:
                self._index.put(torch.from_numpy(keys), locations(sid, 0, len(keys)))
        for sid in gone:
            self._forget_segment(sid)
        self._segments.update(segments)
        self._chain = Chain.of(m)
        return torch.from_numpy(fresh)

    def _forget_segment(self, sid: int) -> None:
        self._segments.pop(sid, None)

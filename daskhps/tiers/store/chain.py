"""The commit chain: how a commit records its state, how that state is rebuilt, and which
commits and files are kept.

A commit's key -> location index is its latest full snapshot, then the key arrays of the
segments written since, replayed in id order (later segments win; a deletion record removes
its keys). With ``snapshot_every=3``::

    commit (seq)    1          2             3              4
    snapshot        -          -             index/3        index/3
    replay          [1, 2]     [1, 2, 3]     []             [4]
    segments        {1, 2}     {1, 2, 3}     {1, 2, 3}      {1, 2, 3, 4}   (rows read from)

so a commit costs what was written since the previous one, not the table size. A commit
writes a snapshot every ``snapshot_every`` commits, after a compaction, and whenever replaying
would read more keys than a snapshot holds (:meth:`Chain.wants_snapshot`).

A commit may also carry arrays (``attached/<seq>``, :func:`write_attached`); a commit that
gives none keeps the ones of the state it extends, so they cost a write only when they change.

Retention: :meth:`CommitLog.drop` keeps the newest commits; then :meth:`CommitLog.garbage`
lists the segments, snapshots and attached arrays that neither a kept commit nor the open
state uses.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from daskhps._paths import tree_bytes
from daskhps.errors import CommitNotFoundError, DataError, StoreCorruptedError
from daskhps.tiers.base import CommitInfo
from daskhps.tiers.index import MIN_CAPACITY, KeyIndex
from daskhps.tiers.store.arrays import RawArray, write_array, write_group
from daskhps.tiers.store.durable import fsync_dir, fsync_tree
from daskhps.tiers.store.layout import StoreFolder, locations, segment_of
from daskhps.tiers.store.manifest import (
    ATTACHED_NAME,
    Attached,
    Manifest,
    scan_manifests,
    write_manifest,
)
from daskhps.tiers.store.segments import Segment

__all__ = [
    "Chain",
    "CommitLog",
    "Garbage",
    "read_attached",
    "rebuild_index",
    "write_attached",
    "write_snapshot",
]

_SNAPSHOT_CHUNK_ROWS = 1 << 20


@dataclass
class Chain:
    """How the open state is rebuilt: snapshot, then the replay segments in order."""

    snapshot: int | None = None
    replay: list[int] = field(default_factory=list)
    refs: set[int] = field(default_factory=set)  # every segment the state reads rows from
    since_snapshot: int = 0
    force_snapshot: bool = False
    attached: Attached | None = None  # the arrays the state carries (none: no folder)

    @classmethod
    def of(cls, m: Manifest) -> Chain:
        return cls(
            m.snapshot, list(m.replay), set(m.segments), m.since_snapshot, attached=m.attached
        )

    def add(self, sid: int) -> None:
        """A new segment joins the state."""
        self.replay.append(sid)
        self.refs.add(sid)

    def wants_snapshot(self, snapshot_every: int, replay_rows: int, index_rows: int) -> bool:
        """Whether the next commit writes a full index snapshot (the snapshot policy)."""
        return (
            self.force_snapshot
            or self.since_snapshot + 1 >= snapshot_every
            # Replaying more keys than a snapshot holds would make opening slower than loading one.
            or replay_rows > 2 * index_rows
        )


def write_snapshot(
    folder: StoreFolder,
    seq: int,
    index: KeyIndex,
    attached: Attached | None = None,
    deletions: set[int] | frozenset[int] = frozenset(),
) -> Chain:
    """Write ``index`` as commit ``seq``'s snapshot, durably; the chain that starts there
    (carrying ``attached``). The snapshot needs no deletion record, but the state keeps
    referring to ``deletions`` (until a compaction): a reader at an earlier commit moving
    to a later one learns from them which of its keys were deleted."""
    keys, locs = index.items()
    keys_np, locs_np = keys.cpu().numpy(), locs.cpu().numpy()
    refs = {int(s) for s in np.unique(segment_of(locs_np))}
    path = folder.snapshot(seq)
    write_group(path, {"rows": int(keys_np.shape[0])})
    write_array(path / "keys", keys_np, _SNAPSHOT_CHUNK_ROWS)
    write_array(path / "locs", locs_np, _SNAPSHOT_CHUNK_ROWS)
    fsync_tree(path)
    fsync_dir(path.parent)
    return Chain(snapshot=seq, refs=refs | set(deletions), attached=attached)


def write_attached(folder: StoreFolder, seq: int, arrays: Mapping[str, np.ndarray]) -> Attached:
    """Write ``arrays`` as the arrays commit ``seq`` attaches, durably (before its manifest);
    names must match :data:`ATTACHED_NAME`."""
    for name in arrays:
        if not isinstance(name, str) or not ATTACHED_NAME.match(name):
            raise DataError(
                f"{folder.name}: attached array name {name!r}: use lowercase letters, digits "
                "and '_', starting with a letter"
            )
    path = folder.attached(seq)
    shutil.rmtree(path, ignore_errors=True)  # a crashed commit's, under a seq never recorded
    write_group(path, {"names": sorted(arrays)})
    for name, data in arrays.items():
        write_array(path / name, np.ascontiguousarray(data), _SNAPSHOT_CHUNK_ROWS)
    fsync_tree(path)
    fsync_dir(path.parent)
    return Attached(seq, tuple(sorted(arrays)))


def read_attached(folder: StoreFolder, attached: Attached | None, name: str) -> np.ndarray | None:
    """Array ``name`` of ``attached`` (None when the state carries no array of that name);
    :class:`StoreCorruptedError` naming the folder when its files are missing or damaged."""
    if attached is None or name not in attached.names:
        return None
    path = folder.attached(attached.seq) / name
    try:
        meta = json.loads((path / "zarr.json").read_text())
        array = RawArray.load(path, np.dtype(meta["data_type"]))
    except FileNotFoundError as e:
        raise StoreCorruptedError(f"attached array {path} is missing") from e
    except (ValueError, KeyError, TypeError) as e:
        raise StoreCorruptedError(f"attached array {path} is unreadable ({e})") from e
    array.check_files()
    return array.read_all()


def rebuild_index(folder: StoreFolder, m: Manifest, segments: Mapping[int, Segment]) -> KeyIndex:
    """The index of commit ``m``: its snapshot, then its replay segments (from ``segments``).
    Raises :class:`StoreCorruptedError` naming what is missing or inconsistent."""
    index = KeyIndex(max(MIN_CAPACITY, m.rows))
    if m.snapshot is not None:
        path = folder.snapshot(m.snapshot)
        if not path.is_dir():
            raise StoreCorruptedError(f"index snapshot {path} is missing")
        keys_a = RawArray.load(path / "keys", np.int64)
        locs_a = RawArray.load(path / "locs", np.int64)
        for a in (keys_a, locs_a):
            a.check_files()
        snap_keys, snap_locs = keys_a.read_all(), locs_a.read_all()
        if snap_keys.shape != snap_locs.shape:
            raise StoreCorruptedError(f"index snapshot {path}: keys and locs differ")
        index.put(torch.from_numpy(snap_keys), torch.from_numpy(snap_locs))
    for sid in m.replay:
        seg = segments[sid]
        if seg.deletes:
            index.delete(torch.from_numpy(seg.keys.read_all()))
        else:
            index.put(torch.from_numpy(seg.keys.read_all()), locations(sid, 0, seg.n))
    if len(index) != m.rows:
        raise StoreCorruptedError(
            f"manifest {m.path} records {m.rows} keys but its segments hold {len(index)}"
        )
    return index


@dataclass(frozen=True)
class Garbage:
    """Segments and snapshots on disk that nothing kept uses."""

    segments: list[int]
    snapshots: list[int]
    attached: list[int] = field(default_factory=list)

    def delete(self, folder: StoreFolder) -> int:
        """Delete them, durably; returns the bytes freed."""
        freed = 0
        paths = [
            *map(folder.segment, self.segments),
            *map(folder.snapshot, self.snapshots),
            *map(folder.attached, self.attached),
        ]
        for path in paths:
            freed += tree_bytes(path)
            shutil.rmtree(path)
        fsync_dir(folder.segments)
        fsync_dir(folder.index)
        if self.attached:
            fsync_dir(folder.attached_root)
        return freed


class CommitLog:
    """The commit manifests of one store, as last scanned: the readable ones oldest first,
    and the damaged ones by number with why they cannot be read."""

    def __init__(self, folder: StoreFolder) -> None:
        self.folder = folder
        self.manifests: list[Manifest] = []
        self.damaged: dict[int, tuple[Path, str]] = {}

    def scan(self) -> None:
        self.manifests, self.damaged = scan_manifests(self.folder.commits)

    def infos(self) -> list[CommitInfo]:
        return [m.info for m in self.manifests]

    def choose(self, commit: str | None) -> Manifest | None:
        """The manifest of ``commit``, or the latest one (None for a store without commits).

        Raises
        ------
        CommitNotFoundError
            No readable commit has that name; the message lists those there are.
        StoreCorruptedError
            The newest manifest (when ``commit`` is None) is damaged.
        """
        f = self.folder
        names = [m.name for m in self.manifests]
        if commit is not None:
            for m in reversed(self.manifests):
                if m.name == commit:
                    return m
            damaged = f"; damaged manifests: {self._damaged_list()}" if self.damaged else ""
            raise CommitNotFoundError(
                f"{f.name}: {f.path} has no commit {commit!r}; available: "
                f"{names or 'none'}{damaged}"
            )
        newest_damaged = max(self.damaged, default=0)
        if newest_damaged > max((m.seq for m in self.manifests), default=0):
            path, why = self.damaged[newest_damaged]
            raise StoreCorruptedError(
                f"{f.name}: the newest commit manifest {path} is damaged ({why}); "
                f"{self.earlier_hint(newest_damaged)}"
            )
        return self.manifests[-1] if self.manifests else None

    def earlier_hint(self, seq: int) -> str:
        """What to do when commit ``seq`` cannot be opened: the earlier ones to try."""
        earlier = [m.name for m in self.manifests if m.seq < seq]
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
        return [str(p) for p, _ in self.damaged.values()]

    def last_seq(self) -> int:
        """The highest manifest number on disk, damaged ones included (0 for none)."""
        return max([0, *self.damaged, *(m.seq for m in self.manifests)])

    def record(self, m: Manifest) -> None:
        """Make ``m`` visible (atomically, durably); it replaces a commit of the same name."""
        write_manifest(self.folder.commits, m)
        superseded = [old for old in self.manifests if old.name == m.name]
        for old in superseded:
            old.path.unlink(missing_ok=True)
        if superseded:
            fsync_dir(self.folder.commits)
        self.manifests = [old for old in self.manifests if old.name != m.name] + [m]

    def drop(self, keep: int) -> list[Manifest]:
        """Delete the manifests of all but the newest ``keep`` commits (damaged ones count
        and go too); returns the dropped readable ones. Their files stay: see :meth:`garbage`.
        """
        f = self.folder
        if not isinstance(keep, int) or keep < 1:
            raise DataError(f"{f.name}: drop_commits keeps at least 1 commit, got {keep!r}")
        everything = sorted([*(m.seq for m in self.manifests), *self.damaged])
        kept = set(everything[-keep:])
        damaged_kept = [self.damaged[s][0] for s in kept if s in self.damaged]
        if damaged_kept:
            raise StoreCorruptedError(
                f"{f.name}: kept commit manifests {damaged_kept} are damaged, so the "
                f"segments they use are unknown and nothing was deleted; remove those files "
                f"(their commits are lost anyway) and call drop_commits again"
            )
        dropped = [m for m in self.manifests if m.seq not in kept]
        for m in dropped:
            m.path.unlink(missing_ok=True)
        for s in [s for s in self.damaged if s not in kept]:
            self.damaged.pop(s)[0].unlink(missing_ok=True)
        fsync_dir(f.commits)
        self.manifests = [m for m in self.manifests if m.seq in kept]
        return dropped

    def forget(self, names: set[str]) -> list[Manifest]:
        """Delete the manifests of the commits called ``names`` (any age); returns them. Their
        files stay: see :meth:`garbage`."""
        dropped = [m for m in self.manifests if m.name in names]
        for m in dropped:
            m.path.unlink(missing_ok=True)
        if dropped:
            fsync_dir(self.folder.commits)
        self.manifests = [m for m in self.manifests if m.name not in names]
        return dropped

    def garbage(self, live: Chain) -> Garbage:
        """Segments and snapshots on disk that no kept commit and no live row uses."""
        # The live state needs only refs: after a compaction the replay list is stale, and the
        # next commit (a forced snapshot) does not use it.
        keep_segments = set(live.refs)
        keep_snapshots = {live.snapshot}
        keep_attached = {live.attached.seq if live.attached else None}
        for m in self.manifests:
            keep_segments.update(m.segments)
            keep_snapshots.add(m.snapshot)
            keep_attached.add(m.attached.seq if m.attached else None)
        return Garbage(
            [sid for sid in self.folder.segment_ids() if sid not in keep_segments],
            [seq for seq in self.folder.snapshot_seqs() if seq not in keep_snapshots],
            [seq for seq in self.folder.attached_seqs() if seq not in keep_attached],
        )

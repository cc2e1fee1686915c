"""Check a zarr store's files against its own metadata without opening it.

What ``daskhps inspect`` reports for each checkpoint and ``daskhps predict`` checks before it
starts a cluster. For one commit of a store: its commit manifest, every segment it reads rows
from, its index snapshot and the arrays it carries. Each array's ``zarr.json`` says how many
chunk files it has and how long each is, so a missing or truncated file is found with one
``stat`` per file; with ``verify`` the sha256 recorded for each chunk file when it was written
is recomputed from disk (every byte read), which also finds a changed byte. Arrays written
before daskhps recorded checksums are counted (:attr:`StoreCheck.without_checksum`) and
checked by size only.

Opening the store (:func:`~daskhps.tiers.store.open_store`) stops at the first problem;
this lists all of them, and never writes or locks anything.
"""

from __future__ import annotations

import json
import time as _time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from daskhps.errors import StoreCorruptedError
from daskhps.tiers.store.arrays import RawArray
from daskhps.tiers.store.layout import RootCheck, segment_dir, snapshot_dir
from daskhps.tiers.store.manifest import Attached, Manifest, scan_manifests
from daskhps.tiers.store.segments import is_deletion

__all__ = ["CommitId", "StoreCheck", "StoreChecker"]


@dataclass(frozen=True)
class CommitId:
    """What tells one commit of a name from another of the same name: committing a name again
    (another run in the same stores) gives it a new ``seq`` and ``time``."""

    seq: int
    time: float
    rows: int

    @classmethod
    def of(cls, m: Manifest) -> CommitId:
        return cls(m.seq, m.time, m.rows)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CommitId | None:
        """From a checkpoint's shard record (``commit_seq``, ``commit_time``, ``commit_rows``);
        None for a record made before checkpoints noted them."""
        try:
            return cls(int(d["commit_seq"]), float(d["commit_time"]), int(d["commit_rows"]))
        except (KeyError, TypeError, ValueError):
            return None

    def to_json(self) -> dict[str, Any]:
        return {"commit_seq": self.seq, "commit_time": self.time, "commit_rows": self.rows}

    def matches(self, m: Manifest) -> bool:
        return (m.seq, m.time, m.rows) == (self.seq, self.time, self.rows)

    def __str__(self) -> str:
        when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(self.time))
        return f"seq {self.seq}, {self.rows:,} rows, {when}"


@dataclass
class StoreCheck:
    """What checking one commit of one store found.

    Attributes
    ----------
    path, commit:
        The store and the commit checked (None: its latest).
    found:
        The identity of the commit of that name the store holds; None when there is none to
        read (no store, no metadata, no such commit).
    segments:
        Segments the commit reads rows from (all of them checked).
    snapshots:
        Index snapshots the commit loads (0 or 1; checked too).
    without_checksum:
        Segments and index snapshots among those written before daskhps recorded sha256
        checksums: only their sizes can be checked.
    verified:
        Whether the sha256 of every chunk file that has one was recomputed.
    damage:
        One line per problem, each naming the file; empty when the commit is sound.
    """

    path: Path
    commit: str | None
    found: CommitId | None = None
    segments: int = 0
    snapshots: int = 0
    without_checksum: int = 0
    verified: bool = False
    damage: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.damage

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "commit": self.commit,
            "segments": self.segments,
            "snapshots": self.snapshots,
            "without_checksum": self.without_checksum,
            "verified": self.verified,
            "damage": list(self.damage),
        }


@dataclass(frozen=True)
class _Part:
    """The result of checking one segment or index snapshot."""

    damage: tuple[str, ...]
    checksummed: bool


class StoreChecker:
    """Checks commits of stores; remembers each segment's result, so the segments that the
    commits of one store share (most of them, between successive checkpoints) are read
    once."""

    def __init__(self, *, verify: bool = False) -> None:
        self.verify = verify
        self._parts: dict[Path, _Part] = {}

    def check(
        self, path: str | Path, commit: str | None = None, recorded: CommitId | None = None
    ) -> StoreCheck:
        """Check ``commit`` (default: the latest) of the store at ``path``; with ``recorded``
        (what a checkpoint noted of that commit when it was made), that the commit of that
        name is still the same one, not one written later under the same name."""
        p = Path(path)
        out = StoreCheck(p, commit, verified=self.verify)
        widths = self._root(p, out)
        if widths is None:
            return out
        m = self._manifest(p, commit, out)
        if m is None:
            return out
        out.found = CommitId.of(m)
        if recorded is not None and not recorded.matches(m):
            out.damage.append(
                f"commit {m.name!r} of store {p} is not the one recorded ({recorded}; the store "
                f"holds {CommitId.of(m)}): another run wrote these stores since"
            )
        out.segments = len(m.segments)
        parts = [(segment_dir(p, sid), "segment") for sid in m.segments]
        if m.snapshot is not None:
            out.snapshots = 1
            parts.append((snapshot_dir(p, m.snapshot), "index snapshot"))
        for folder, kind in parts:
            part = self._parts.get(folder)
            if part is None:
                part = self._parts[folder] = self._check_part(folder, kind, widths)
            out.damage.extend(part.damage)
            out.without_checksum += not part.checksummed
        if m.attached is not None:
            out.damage.extend(self._check_attached(p, m.attached))
        return out

    def _check_deletion(self, folder: Path) -> _Part:
        try:
            keys = RawArray.load(folder / "keys", np.int64)
        except StoreCorruptedError as e:
            return _Part((str(e),), True)
        damage = keys.size_problems() + (keys.digest_problems() if self.verify else [])
        return _Part(tuple(damage), keys.sha256 is not None)

    def _check_attached(self, p: Path, attached: Attached) -> list[str]:
        """Problems of the arrays a commit carries (``commit(..., attach=...)``)."""
        folder = p / "attached" / f"{attached.seq:010d}"
        damage: list[str] = []
        for name in attached.names:
            meta = folder / name / "zarr.json"
            try:
                dtype = np.dtype(json.loads(meta.read_text())["data_type"])
                array = RawArray.load(folder / name, dtype)
            except FileNotFoundError:
                damage.append(f"attached array {folder / name} is missing")
                continue
            except (OSError, ValueError, KeyError, TypeError, StoreCorruptedError) as e:
                damage.append(f"attached array {folder / name} is unreadable ({e})")
                continue
            damage += array.size_problems()
            if self.verify:
                damage += array.digest_problems()
        return damage

    def rank_damage(
        self,
        paths: Sequence[Path],
        commit: str | None,
        recorded: Sequence[CommitId | None] | None = None,
    ) -> list[str]:
        """Problems of a table's rank stores (rank ``r`` at ``paths[r]``, whose commit was
        ``recorded[r]`` where known) at ``commit``, one line each, prefixed by the rank: what
        a caller about to open them all reports."""
        ids = list(recorded) if recorded is not None else [None] * len(paths)
        return [
            f"rank {r}: {d}"
            for r, p in enumerate(paths)
            for d in self.check(p, commit, ids[r]).damage
        ]

    def _root(self, p: Path, out: StoreCheck) -> tuple[int, ...] | None:
        """The row widths the store's segments may have (two after a format upgrade)."""
        meta = p / "zarr.json"
        if not p.is_dir():
            out.damage.append(f"no store at {p} (moved, deleted, or on another machine)")
            return None
        try:
            attrs = json.loads(meta.read_text())["attributes"]["daskhps"]
            width = int(attrs["width"])
            return RootCheck(int(attrs.get("narrow_width", width))).widths(width)
        except FileNotFoundError:
            out.damage.append(f"store metadata {meta} is missing")
        except (OSError, ValueError, KeyError, TypeError) as e:
            out.damage.append(f"store metadata {meta} is unreadable ({e!r})")
        return None

    @staticmethod
    def _manifest(p: Path, commit: str | None, out: StoreCheck) -> Manifest | None:
        good, bad = scan_manifests(p / "commits")
        damaged = [f"{path} ({why})" for path, why in bad.values()]
        if commit is None:
            newest_bad = max(bad, default=0)
            if newest_bad > max((m.seq for m in good), default=0):
                path, why = bad[newest_bad]
                out.damage.append(f"the newest commit manifest {path} is damaged ({why})")
                return None
            if not good:
                out.damage.append(f"store {p} has no commit")
            return good[-1] if good else None
        for m in reversed(good):
            if m.name == commit:
                return m
        out.damage.append(
            f"store {p} has no commit {commit!r} (its commits: {[m.name for m in good]}"
            + (f"; damaged commit manifests: {damaged}" if damaged else "")
            + ")"
        )
        return None

    def _check_part(self, folder: Path, kind: str, widths: tuple[int, ...]) -> _Part:
        if not folder.is_dir():
            return _Part((f"{kind} folder {folder} is missing",), True)
        if kind == "segment":
            try:
                deletion = is_deletion(folder)
            except StoreCorruptedError as e:
                return _Part((str(e),), True)
            if deletion:
                return self._check_deletion(folder)
        names = ("keys", "rows") if kind == "segment" else ("keys", "locs")
        dtypes = (np.int64, np.float32) if kind == "segment" else (np.int64, np.int64)
        damage: list[str] = []
        arrays = []
        for name, dtype in zip(names, dtypes, strict=True):
            try:
                arrays.append(RawArray.load(folder / name, dtype))
            except StoreCorruptedError as e:
                damage.append(str(e))
        if damage:
            return _Part(tuple(damage), True)
        a, b = arrays
        wants = [(a.shape[0], w) for w in widths] if kind == "segment" else [a.shape]
        if len(a.shape) != 1 or b.shape not in wants:
            shown = " or ".join(str(list(w)) for w in wants)
            damage.append(
                f"{kind} {folder} holds {names[0]} {a.shape} and {names[1]} {b.shape}, "
                f"expected [n] and {shown}"
            )
        for arr in arrays:
            damage += arr.size_problems()
            if self.verify:
                damage += arr.digest_problems()
        return _Part(tuple(damage), all(arr.sha256 is not None for arr in arrays))

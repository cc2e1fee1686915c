"""The interfaces of the tiers: the one a cache implements and the one the persistent store does.

A tier maps int64 keys to fixed-width float32 rows. Every operation is vectorised over a key
array; no tier loops over keys in Python. Rows are opaque to tiers: they are moved bit for bit
(optimizer state, including integer counters stored as float32 bit patterns, travels with them).

::

    keys   int64[n]            k0   k1   k2   ...
    rows   float32[n, width]   r0   r1   r2   ...     (embedding | optimizer state)
    found  bool[n]             T    F    T    ...     (rows[i] is zero where found[i] is False)
    dirty  bool[n]             the row differs from the copy in the tier below

    Tier                  the map every tier is: lookup, keys, len, stats, close
     ├── Cache            bounded: displaces rows to make room (Evicted, so the caller can
     │                    write dirty ones further down); slots the table updates in place.
     │                    DeviceCache, HostMemory (tiers/_slots.py: SlotCache)
     └── PersistentStore  the complete copy: never displaces a row; named commits.
                          StoreReader (read-only), StoreWriter (tiers/store/)

The table (``daskhps.table.table``) is typed against :class:`Cache` and
:class:`PersistentStore` only: these two declare everything it and its callers use.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

import numpy as np
import torch

from daskhps.errors import DataError

__all__ = [
    "Attachments",
    "Cache",
    "CommitInfo",
    "CommitMeta",
    "CompactReport",
    "Evicted",
    "Lookup",
    "PersistentStore",
    "Tier",
    "TierStats",
    "check_keys",
    "check_rows",
]

_Store = TypeVar("_Store", bound="PersistentStore")

CommitMeta: TypeAlias = dict[str, Any] | None
"""The caller's JSON-able metadata of a commit (:meth:`PersistentStore.commit`)."""
Attachments: TypeAlias = Mapping[str, np.ndarray] | None
"""Named arrays a commit carries beside its rows; None: those of the state it extends."""


@dataclass(frozen=True)
class Lookup:
    """Result of :meth:`Tier.lookup`: ``rows[i]`` is valid where ``found[i]``."""

    rows: torch.Tensor
    found: torch.Tensor


@dataclass(frozen=True)
class Evicted:
    """Rows that left a tier, with whether each differs from the tier below."""

    keys: torch.Tensor
    rows: torch.Tensor
    dirty: torch.Tensor

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    @staticmethod
    def empty(width: int, device: torch.device | str = "cpu") -> Evicted:
        return Evicted(
            keys=torch.empty(0, dtype=torch.int64, device=device),
            rows=torch.empty(0, width, dtype=torch.float32, device=device),
            dirty=torch.empty(0, dtype=torch.bool, device=device),
        )

    def to(self, device: torch.device | str) -> Evicted:
        return Evicted(self.keys.to(device), self.rows.to(device), self.dirty.to(device))

    def only_dirty(self) -> Evicted:
        d = self.dirty
        return Evicted(self.keys[d], self.rows[d], d[d])

    @staticmethod
    def concat(parts: list[Evicted], width: int, device: torch.device | str = "cpu") -> Evicted:
        parts = [p for p in parts if len(p)]
        if not parts:
            return Evicted.empty(width, device)
        if len(parts) == 1:
            return parts[0]
        return Evicted(
            torch.cat([p.keys for p in parts]),
            torch.cat([p.rows for p in parts]),
            torch.cat([p.dirty for p in parts]),
        )


@dataclass(frozen=True)
class CommitInfo:
    """A durable commit point of a store: one checkpoint of its shard.

    Attributes
    ----------
    name:
        The caller's name for it (e.g. ``"pass-12"``); committing a name again replaces it.
    seq:
        Position in the store's history; later commits have larger ``seq``.
    time:
        Unix time of the commit.
    rows:
        Keys in the committed state.
    snapshot:
        Whether this commit wrote a full index snapshot (else it replays segments).
    segments:
        Segments the committed state reads rows from.
    meta:
        The caller's JSON metadata.
    """

    name: str
    seq: int
    time: float
    rows: int
    snapshot: bool
    segments: int
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompactReport:
    """What :meth:`PersistentStore.compact` did."""

    segments_rewritten: int
    rows_moved: int
    segments_deleted: int
    bytes_freed: int


@dataclass
class TierStats:
    """Counters a tier keeps; they feed pass metrics and the dashboard."""

    lookups: int = 0
    hits: int = 0
    inserts: int = 0
    evictions: int = 0
    rows_written: int = 0
    rows_read: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def as_dict(self) -> dict[str, float]:
        d: dict[str, float] = {
            "lookups": self.lookups,
            "hits": self.hits,
            "hit_rate": self.hit_rate,
            "inserts": self.inserts,
            "evictions": self.evictions,
            "rows_written": self.rows_written,
            "rows_read": self.rows_read,
        }
        d.update(self.extra)
        return d


class Tier(ABC):
    """One level of the hierarchy: a map from int64 keys to float32 rows of ``width`` floats.

    Attributes
    ----------
    name:
        ``"<table>/<tier kind>"``; used in every error message.
    width:
        Floats per row (embedding dim plus optimizer state).
    device:
        Where the tier's tensors live; results are returned on this device.
    persistent:
        True for the bottom store, which never displaces rows.
    """

    name: str
    width: int
    device: torch.device
    persistent: bool = False

    @property
    @abstractmethod
    def capacity_rows(self) -> int | None:
        """Most rows the tier can hold (``None`` for unbounded)."""

    @abstractmethod
    def lookup(self, keys: torch.Tensor, *, out: torch.Tensor | None = None) -> Lookup:
        """Rows of ``keys``; rows of missing keys are zero. ``out`` is an optional
        preallocated ``float32[n, width]`` buffer on :attr:`device` to fill."""

    @abstractmethod
    def keys(self) -> torch.Tensor:
        """All resident keys (int64, order unspecified)."""

    @abstractmethod
    def __len__(self) -> int:
        """Resident rows."""

    @property
    @abstractmethod
    def stats(self) -> TierStats:
        """Counters since creation."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release resources (files, locks)."""

    def __contains__(self, key: object) -> bool:
        k = torch.as_tensor([key], dtype=torch.int64)
        return bool(self.lookup(k).found[0])


class Cache(Tier):
    """A bounded tier above the store: it displaces rows to make room and knows which of its
    rows differ from the tier below (dirty).

    Besides the map, the table updates rows in place through slots: :meth:`find_slots` gives
    positions in :attr:`rows`, :meth:`mark_dirty` records a change, and pins keep a pass's
    working set resident (:meth:`pin_slots` until :meth:`unpin_slots` or :meth:`unpin_all`).
    Slots are ``int64`` positions in :attr:`rows`, ``-1`` for a missing key.
    """

    @property
    @abstractmethod
    def capacity_rows(self) -> int:
        """Rows held, all of them usable."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes of every tensor the cache holds, index included."""

    @abstractmethod
    def upsert(self, keys: torch.Tensor, rows: torch.Tensor, *, dirty: bool = True) -> Evicted:
        """Insert or overwrite the rows of unique ``keys``.

        Returns the rows displaced to make room (never one of ``keys``). Raises
        :class:`~daskhps.errors.CapacityError` if the rows cannot all be placed.
        """

    @abstractmethod
    def insert_new(
        self, keys: torch.Tensor, rows: torch.Tensor, dirty: torch.Tensor
    ) -> tuple[torch.Tensor, Evicted]:
        """Insert rows of keys that are unique and absent; returns their slots and the rows
        displaced to make room.

        :meth:`upsert` without its uniqueness check and lookup, for callers that know both
        (keys that just missed this cache, or rows moving between exclusive tiers). ``dirty``
        is a flag per row. Displaces unpinned rows only; refuses (changing nothing) when they
        are too few.
        """

    @abstractmethod
    def take(self, keys: torch.Tensor) -> tuple[torch.Tensor, Evicted]:
        """Remove the rows of the present ones among ``keys`` (unique); returns the found mask
        and the removed rows in the order of ``keys[found]``."""

    @abstractmethod
    def evict(self, keys: torch.Tensor | None = None, n: int | None = None) -> Evicted:
        """Remove rows and return them: those of ``keys`` that are present, or else up to ``n``
        victims chosen by the tier's replacement policy."""

    @abstractmethod
    def flush(self, limit: int | None = None) -> Evicted:
        """Return every dirty row (they stay resident) and mark them clean; with ``limit``,
        at most that many of them (the rest stay dirty for the next call)."""

    @property
    @abstractmethod
    def rows(self) -> torch.Tensor:
        """The slab, ``float32[capacity_rows, width]``; index it with :meth:`find_slots`."""

    @abstractmethod
    def find_slots(self, keys: torch.Tensor, *, touch: bool = False) -> torch.Tensor:
        """Slot of each key in :attr:`rows`, ``-1`` where missing.

        ``touch`` counts the call as a use of the found rows for the replacement policy.
        """

    @abstractmethod
    def distinct_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """The distinct values of ``slots`` (all valid, ``>= 0``), ascending."""

    @abstractmethod
    def touch(self, slots: torch.Tensor) -> None:
        """Count a use of the rows in ``slots`` for the replacement policy."""

    @abstractmethod
    def mark_dirty(self, slots: torch.Tensor) -> None:
        """Record that the rows in ``slots`` were changed in place through :attr:`rows`."""

    @abstractmethod
    def pinned_at(self, slots: torch.Tensor) -> torch.Tensor:
        """Whether each of ``slots`` is pinned."""

    @abstractmethod
    def dirty_at(self, slots: torch.Tensor) -> torch.Tensor:
        """Whether each of ``slots`` holds a row changed since it was last written down."""

    @abstractmethod
    def pin_slots(self, slots: torch.Tensor) -> None:
        """Protect the rows in ``slots`` (occupied slots) from eviction until they are
        unpinned."""

    @abstractmethod
    def unpin_slots(self, slots: torch.Tensor) -> None:
        """Release the pins of ``slots`` only (the others stay)."""

    @abstractmethod
    def unpin_all(self) -> None:
        """Release every pin."""

    @property
    @abstractmethod
    def pinned_count(self) -> int:
        """Rows pinned now."""


class PersistentStore(Tier):
    """The complete persistent copy of one shard: it never displaces a row, and names
    durable states (commits) that can be opened again.

    Writes since the last :meth:`commit` are in no commit: reopening (or a crash) returns to
    the last commit. A store opened read-only (:attr:`read_only`) refuses every write with
    :class:`~daskhps.errors.StoreReadOnlyError`, naming the mode that would allow it.

    Attributes
    ----------
    path:
        The store's folder.
    """

    persistent = True
    path: Path

    @property
    def capacity_rows(self) -> None:
        return None

    @property
    @abstractmethod
    def read_only(self) -> bool:
        """True when opened read-only (or closed): writes raise."""

    @abstractmethod
    def contains(self, keys: torch.Tensor) -> torch.Tensor:
        """``bool[n]``: whether each key has a row here (the index only; no row is read)."""

    @abstractmethod
    def upsert(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Write the rows of unique ``keys`` (a new row for a key replaces its old one)."""

    @abstractmethod
    def delete(self, keys: torch.Tensor) -> int:
        """Remove the rows of unique ``keys`` (absent ones are ignored); returns how many
        were removed. Like a write, it is in no commit until the next one."""

    @abstractmethod
    def flush(self) -> None:
        """Make every write so far durable on disk (still in no commit)."""

    @abstractmethod
    def commit(self, name: str, meta: CommitMeta = None, attach: Attachments = None) -> CommitInfo:
        """Make everything written so far durable and name the state ``name``, with the
        caller's JSON-able ``meta``. Committing an existing name replaces that commit.

        ``attach``: named arrays the commit carries beside its rows from now on (``{}``:
        none), read back with :meth:`attached`; None keeps those the state carried."""

    @property
    @abstractmethod
    def attached_names(self) -> tuple[str, ...]:
        """Names of the arrays the open state carries."""

    @abstractmethod
    def attached(self, name: str) -> np.ndarray | None:
        """Array ``name`` the open state carries (None: it carries none of that name)."""

    @abstractmethod
    def commits(self) -> list[CommitInfo]:
        """Every readable commit, oldest first."""

    @abstractmethod
    def drop_commits(self, keep: int) -> list[CommitInfo]:
        """Delete all but the newest ``keep`` commits and the files only they used.

        Returns the dropped commits. Readers that opened a dropped commit lose their files.
        """

    @abstractmethod
    def compact(self, min_stale: float = 0.5, merge_below: int = 0) -> CompactReport:
        """Rewrite the live rows of segments with at least ``min_stale`` stale rows, and of
        segments with fewer than ``merge_below`` rows (many small evictions make many small
        segments), into new segments in their write order; then delete every segment and
        snapshot that no kept commit and no live row uses.

        Old segments that kept commits still use are freed once :meth:`drop_commits` drops
        those commits. The next commit writes a full index snapshot.
        """

    def __enter__(self: _Store) -> _Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_keys(keys: object, where: str, device: torch.device | None = None) -> torch.Tensor:
    """Validate a key array: 1-D int64 torch tensor (numpy int64 arrays are accepted); moved
    to ``device`` if given."""
    if not isinstance(keys, torch.Tensor):
        import numpy as np

        if isinstance(keys, np.ndarray) and keys.dtype == np.int64:
            keys = torch.from_numpy(keys)
        else:
            raise DataError(
                f"{where}: keys must be a 1-D int64 torch tensor (or numpy int64 array), "
                f"got {type(keys).__name__}; convert with torch.as_tensor(keys, dtype=torch.int64)"
            )
    if keys.dtype != torch.int64:
        raise DataError(
            f"{where}: keys must be int64, got {keys.dtype}; "
            f"cast with keys.to(torch.int64) (keys are 64-bit hashes of (field, value))"
        )
    if keys.dim() != 1:
        raise DataError(f"{where}: keys must be 1-D, got shape {tuple(keys.shape)}; flatten first")
    return keys if device is None else keys.to(device)


def check_rows(rows: object, n: int, width: int, where: str) -> torch.Tensor:
    """Validate a row block: float32 tensor of shape ``[n, width]``."""
    if not isinstance(rows, torch.Tensor):
        raise DataError(f"{where}: rows must be a torch tensor, got {type(rows).__name__}")
    if rows.dtype != torch.float32:
        raise DataError(f"{where}: rows must be float32, got {rows.dtype}")
    if rows.dim() != 2 or rows.shape[0] != n or rows.shape[1] != width:
        raise DataError(
            f"{where}: rows must have shape [{n}, {width}] (one row of width {width} per key), "
            f"got {tuple(rows.shape)}"
        )
    return rows

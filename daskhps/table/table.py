"""One shard of one embedding table: device cache -> host memory -> zarr store -> init.

::

    lookup(keys)            unique keys ──► device cache ──hit──────────────────────► rows
                                              │ miss
                                              ▼
                                            host memory ──hit (moved up)──┐
                                              │ miss                      │
                                              ▼                           ▼
                                            zarr store ──hit (copied up)──► device cache
                                              │ miss                      ▲
                                              ▼                           │
                                            init(seed, key) ──────────────┘
    rows displaced from the device go to host memory; dirty rows displaced from host memory
    are appended to the zarr store. Everything below the device hit is the read path
    (daskhps.table.read_path), which serving shares.

The device and host tiers are *exclusive*: a row sits in at most one of them, carrying a dirty
flag that says whether it differs from the store's copy. Rows that were only initialised are
clean (the store lacks them, but re-initialising gives the same bits), so looking keys up
never writes to disk. ``flush`` appends every dirty row to the store; ``commit`` then records
a named commit point, the state a later ``open(..., commit=name)`` returns to.

Admission (:mod:`daskhps.table.admission`) uses the same fact: a staged key whose slot is clean
and which the store lacks has no row (:meth:`EmbeddingTable.without_rows`); one the pass does
not admit is frozen (:meth:`EmbeddingTable.freeze`), so its row stays clean, reads its initial
value and is never written down.

:class:`EmbeddingTable` is the public face; each job is a module of its own working on the
shard's :class:`~daskhps.table.shard.Shard`: opening it (:mod:`~daskhps.table.shard`),
lookups and staging (:mod:`~daskhps.table.residency`), optimizer steps and counts
(:mod:`~daskhps.table.updates`), rows for admission and expiry (:mod:`~daskhps.table.rows`),
flushes, commits and closing (:mod:`~daskhps.table.persistence`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from daskhps.errors import CapacityError
from daskhps.table import persistence, residency, rows, updates
from daskhps.table.residency import StageReport
from daskhps.table.shard import (
    Shard,
    check_device_rows,
    open_caches,
    open_shard_store,
    open_tiers,
)
from daskhps.table.spec import TableSpec
from daskhps.tiers.base import Attachments, Cache, CommitInfo, CommitMeta, PersistentStore
from daskhps.tiers.store import StoreOptions

__all__ = ["EmbeddingTable", "StageReport", "open_shard_store"]


class EmbeddingTable:
    """The tier stack of one shard of one table.

    Build it with :meth:`open`. All operations take int64 key tensors and are vectorised.
    The tiers are used through their interfaces only (:mod:`daskhps.tiers.base`).
    """

    def __init__(
        self,
        spec: TableSpec,
        store: PersistentStore,
        device_cache: Cache,
        host: Cache | None,
        policy: Literal["lru", "lfu"] = "lru",
    ) -> None:
        self.spec = spec
        self.policy = policy  # the caches' eviction policy
        self.store = store
        self.device_cache = device_cache
        self.host = host
        self.device = device_cache.device
        self._shard = Shard.of(spec, store, device_cache, host)

    # -- construction --------------------------------------------------------------

    @classmethod
    def open(
        cls,
        spec: TableSpec,
        path: str | Path,
        *,
        device_rows: int,
        host_bytes: int = 0,
        device: str | torch.device = "cpu",
        policy: Literal["lru", "lfu"] = "lru",
        mode: Literal["w", "a", "r"] = "a",
        commit: str | None = None,
        store: StoreOptions | None = None,
    ) -> EmbeddingTable:
        """Open (or create) the shard stored at ``path``.

        Parameters
        ----------
        device_rows:
            Capacity of the device cache in rows (a pass's working set must fit).
        host_bytes:
            Budget of the host-memory tier in bytes (rows, index and metadata); 0 disables it.
        mode:
            ``"w"`` create, ``"a"`` open or create for writing, ``"r"`` read-only.
        commit:
            Open the state of this earlier commit point instead of the latest.
        store:
            How the shard's zarr store writes (``table.tiers.snapshot_every``, ...).
        """
        opened, cache, host = open_tiers(
            spec,
            path,
            device_rows=device_rows,
            host_bytes=host_bytes,
            device=device,
            policy=policy,
            mode=mode,
            commit=commit,
            store=store,
        )
        return cls(spec, opened, cache, host, policy)

    # -- lookups and staging (daskhps.table.residency) -------------------------------------

    def lookup(self, keys: torch.Tensor, *, read_only: bool = False) -> torch.Tensor:
        """Embeddings of ``keys`` (duplicates allowed): ``float32[n, dim]``.

        A training lookup makes the rows resident in the device tier (promoting them from
        below, initialising unseen keys). A ``read_only`` lookup, for evaluation and
        inference, changes no tier: an unseen key reads its initial value.
        """
        found = self.peek(keys) if read_only else residency.lookup_rows(self._shard, keys)
        return found[:, : self.spec.dim]

    def peek(self, keys: torch.Tensor) -> torch.Tensor:
        """Full rows (embedding, optimizer state, statistics) of ``keys`` without changing any
        tier."""
        return residency.peek(self._shard, keys)

    def stage(self, keys: torch.Tensor) -> StageReport:
        """Make a pass's working set resident in the device tier and pin it there.

        ``keys`` may repeat. Pins accumulate (pass k+1 may be staged while pass k is pinned)
        until :meth:`unpin`. Rows already resident cost one hash lookup per key: they are
        deduplicated by their slots, and only the missing keys are sorted.
        """
        return residency.stage(self._shard, keys)

    def unpin(self) -> None:
        """Release every pinned row (end of a pass)."""
        self.device_cache.unpin_all()

    def cached_rows(self) -> int:
        """Rows held in the device and host tiers (the store's not counted)."""
        return len(self.device_cache) + (len(self.host) if self.host is not None else 0)

    def resize_caches(self, device_rows: int, host_bytes: int) -> None:
        """New device and host tiers of these sizes, while both hold no row (before the
        first pass is staged: tables sharing a budget are sized by that pass's keys).

        Raises
        ------
        CapacityError
            ``device_rows`` < 1, or a tier holds rows (they would be lost).
        """
        held = self.cached_rows()
        if held:
            raise CapacityError(
                f"table {self.spec.name!r}: its tiers hold {held} rows; they are resized only "
                "while empty"
            )
        check_device_rows(self.spec, device_rows)
        cache, host = open_caches(
            self.spec,
            device_rows=device_rows,
            host_bytes=host_bytes,
            device=self.device,
            policy=self.policy,
        )
        self.device_cache.close()
        if self.host is not None:
            self.host.close()
        self.device_cache, self.host = cache, host
        self._shard = Shard.of(self.spec, self.store, cache, host)

    # -- admission (daskhps.table.admission; the work in daskhps.table.rows) ---------------

    def without_rows(self, keys: torch.Tensor) -> torch.Tensor:
        """Which of the staged ``keys`` have no row of the table yet: the device tier holds
        only their initial value (clean: never changed) and the store lacks them."""
        return rows.without_rows(self._shard, keys)

    def freeze(self, keys: torch.Tensor) -> None:
        """Take no update for the staged ``keys`` (keys not admitted) until :meth:`thaw`:
        :meth:`apply_gradients` drops their gradients, so they keep their initial value."""
        self._shard.frozen = rows.frozen_mask(self._shard, keys)

    def thaw(self) -> None:
        """Every key takes updates again (the pass that froze some is counted)."""
        self._shard.frozen = None

    # -- expiry (daskhps.table.expiry; the work in daskhps.table.rows) ---------------------

    def row_statistics(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(keys, count, last_day)`` of every row of the shard, each from its freshest copy
        (device, then host, then store; the store is read in blocks of rows). A resident key
        that is only initialised (clean, and not in the store) has no row and is left out."""
        return rows.row_statistics(self._shard)

    def remove(self, keys: torch.Tensor) -> int:
        """Remove the rows of unique ``keys`` from every tier, as if never written (a deletion
        record in the store). A key staged for a pass keeps its slot, reset to its initial
        value and clean: it has no row, as a key never seen. Returns the rows removed."""
        return rows.remove(self._shard, keys)

    # -- training (daskhps.table.updates) --------------------------------------------------

    def apply_gradients(self, keys: torch.Tensor, grads: torch.Tensor) -> None:
        """Sum the gradients of duplicate keys, then update each row's embedding and
        optimizer state in the device tier."""
        updates.apply_gradients(self._shard, keys, grads)

    def record_seen(
        self,
        keys: torch.Tensor,
        counts: torch.Tensor | None = None,
        days: torch.Tensor | int | None = None,
    ) -> None:
        """Count occurrences of ``keys`` in the rows' statistics (:mod:`daskhps.table.stats`):
        ``counts[i]`` more for ``keys[i]`` (1 each by default; duplicate keys add up), and
        ``days`` (one :func:`~daskhps.table.stats.day_number` per key or one for all; ``None``
        or ``NO_DAY`` for logs without days) as their last day seen, the latest of a
        duplicate's. The rows are made resident in the device tier, as a training lookup
        makes them, and are dirty after."""
        updates.record_seen(self._shard, keys, counts, days)

    # -- persistence (daskhps.table.persistence) -------------------------------------------

    def flush(self) -> int:
        """Append every dirty row of the device and host tiers to the store; returns rows
        written. The rows stay resident, now clean."""
        return persistence.flush(self._shard)

    def commit(self, name: str, meta: CommitMeta = None, attach: Attachments = None) -> CommitInfo:
        """Flush, then record a named commit point in the store (carrying ``attach``: see
        :meth:`PersistentStore.commit`)."""
        return persistence.commit(self._shard, name, meta, attach)

    def commits(self) -> list[CommitInfo]:
        return self.store.commits()

    def close(self, *, uncommitted: Literal["warn", "drop"] = "warn") -> None:
        """Release the store's lock. Rows changed since the last commit are not kept: a
        warning says how many, unless ``uncommitted="drop"`` (a caller that restarts from its
        last commit anyway, such as an interrupted training run) says so on purpose."""
        persistence.close(self._shard, uncommitted)

    def __enter__(self) -> EmbeddingTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- introspection -----------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters per tier and where looked-up rows came from."""
        sources = self._shard.sources
        total = sum(sources.values())
        out: dict[str, Any] = {
            "rows_from": dict(sources),
            "hit_rate": {k: (v / total if total else 0.0) for k, v in sources.items()},
            "device": self.device_cache.stats.as_dict(),
            "store": self.store.stats.as_dict(),
            "pinned": self.device_cache.pinned_count,
        }
        if self.host is not None:
            out["host"] = self.host.stats.as_dict()
        return out

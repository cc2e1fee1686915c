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
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from daskhps.errors import CapacityError, DataError
from daskhps.table.optimizers import apply_update
from daskhps.table.read_path import ReadPath, initial_rows
from daskhps.table.spec import TableSpec
from daskhps.table.stats import record, row_stats
from daskhps.tiers.base import Cache, CommitInfo, Evicted, PersistentStore, check_keys
from daskhps.tiers.device import DeviceCache
from daskhps.tiers.host import HostMemory, rows_for_bytes
from daskhps.tiers.store import StoreOptions, StoreReader, open_store

__all__ = ["EmbeddingTable", "StageReport", "open_shard_store"]

log = logging.getLogger(__name__)

_ROWS_PER_SCAN = 1 << 20  # store rows read at once by row_statistics


@dataclass(frozen=True)
class StageReport:
    """Where the rows of a staged working set came from."""

    rows: int
    from_device: int
    from_host: int
    from_store: int
    initialised: int
    pinned: int


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
    ) -> None:
        self.spec = spec
        self.store = store
        self.device_cache = device_cache
        self.host = host
        self.device = device_cache.device
        self._read = ReadPath(spec, device_cache, host, store, write_back=store.upsert)
        self._sources = self._read.rows_from  # where rows came from; the read path counts too
        self._read_only = store.read_only
        self._frozen: torch.Tensor | None = None  # per device slot: a key this pass must not train

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
        dev = torch.device(device)
        if device_rows < 1:
            raise CapacityError(
                f"table {spec.name!r}: device_rows must be >= 1, got {device_rows}; "
                "give the device tier room for at least one pass's working set"
            )
        opened = open_shard_store(spec, path, mode=mode, commit=commit, options=store)
        try:
            cache = DeviceCache(
                f"{spec.name}/device", spec.width, device_rows, device=dev, policy=policy
            )
            host = None
            if rows_for_bytes(spec.width, host_bytes, policy) > 0:
                host = HostMemory(f"{spec.name}/host", spec.width, host_bytes, policy=policy)
        except BaseException:
            opened.close()
            raise
        return cls(spec, opened, cache, host)

    # -- lookups -----------------------------------------------------------------

    def lookup(self, keys: torch.Tensor, *, read_only: bool = False) -> torch.Tensor:
        """Embeddings of ``keys`` (duplicates allowed): ``float32[n, dim]``.

        A training lookup makes the rows resident in the device tier (promoting them from
        below, initialising unseen keys). A ``read_only`` lookup, for evaluation and
        inference, changes no tier: an unseen key reads its initial value.
        """
        rows = self.peek(keys) if read_only else self._lookup_rows(keys)
        return rows[:, : self.spec.dim]

    def peek(self, keys: torch.Tensor) -> torch.Tensor:
        """Full rows (embedding, optimizer state, statistics) of ``keys`` without changing any
        tier."""
        keys = check_keys(keys, self._where("peek")).to(self.device)
        ukeys, inv = torch.unique(keys, return_inverse=True)
        got = self.device_cache.lookup(ukeys)
        rows, found = got.rows, got.found
        if not bool(found.all()):
            miss = (~found).nonzero().squeeze(1)
            rows[miss] = self._read.read(ukeys[miss])
        return rows[inv]

    def _lookup_rows(self, keys: torch.Tensor) -> torch.Tensor:
        self._check_writable("lookup")
        keys = check_keys(keys, self._where("lookup")).to(self.device)
        ukeys, inv = _unique(keys)
        slots = self._resident_slots(ukeys, "lookup")
        rows = self.device_cache.rows.index_select(0, slots)
        return rows if inv is None else rows[inv]

    # -- staging -----------------------------------------------------------------

    def stage(self, keys: torch.Tensor) -> StageReport:
        """Make a pass's working set resident in the device tier and pin it there.

        ``keys`` may repeat. Pins accumulate (pass k+1 may be staged while pass k is pinned)
        until :meth:`unpin`. Rows already resident cost one hash lookup per key: they are
        deduplicated by their slots, and only the missing keys are sorted.
        """
        self._check_writable("stage")
        keys = check_keys(keys, self._where("stage")).to(self.device)
        cache = self.device_cache
        slots = cache.find_slots(keys)
        hit = slots >= 0
        n_hit = int(hit.sum())
        if n_hit == len(keys):
            hit_slots, mkeys = cache.distinct_slots(slots), keys[:0]
        else:
            hit_slots = cache.distinct_slots(slots[hit])
            mkeys = torch.unique(keys[~hit])
        fresh = hit_slots[~cache.pinned_at(hit_slots)]  # resident, not pinned yet
        pinned, cap = cache.pinned_count, cache.capacity_rows
        rows = len(hit_slots) + len(mkeys)
        if pinned + len(fresh) + len(mkeys) > cap:
            raise CapacityError(
                f"table {self.spec.name!r}: staging {rows:,} rows "
                f"({len(fresh) + len(mkeys):,} new, {pinned:,} already pinned) does not fit the "
                f"device tier of {cap:,} rows x {self.spec.row_bytes} bytes; "
                "raise the device tier's size or lower pass.max_working_set"
            )
        before = dict(self._sources)
        cache.touch(hit_slots)
        self._sources["device"] += len(hit_slots)
        cache.pin_slots(fresh)
        if len(mkeys):
            try:
                cache.pin_slots(self._promote(mkeys))
            except BaseException:
                cache.unpin_slots(fresh)
                raise
        got = {k: self._sources[k] - before[k] for k in before}
        return StageReport(
            rows=rows,
            from_device=got["device"],
            from_host=got["host"],
            from_store=got["store"],
            initialised=got["init"],
            pinned=cache.pinned_count,
        )

    def unpin(self) -> None:
        """Release every pinned row (end of a pass)."""
        self.device_cache.unpin_all()

    # -- admission (daskhps.table.admission) ---------------------------------------------

    def without_rows(self, keys: torch.Tensor) -> torch.Tensor:
        """Which of the staged ``keys`` have no row of the table yet: the device tier holds
        only their initial value (clean: never changed) and the store lacks them."""
        keys = check_keys(keys, self._where("without_rows")).to(self.device)
        return ~self._has_row(self.device_cache, keys, self._staged_slots(keys, "without_rows"))

    def _has_row(self, tier: Cache, keys: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Whether each key resident in ``tier`` (at ``slots``) holds a row of the table: one
        changed since it was written down, or one the store has (a clean slot the store lacks
        holds only an initial value). The store is asked about the clean ones only."""
        out = tier.dirty_at(slots).clone()
        clean = (~out).nonzero().squeeze(1)
        if len(clean):
            out[clean] = self.store.contains(keys[clean].cpu()).to(out.device)
        return out

    def freeze(self, keys: torch.Tensor) -> None:
        """Take no update for the staged ``keys`` (keys not admitted) until :meth:`thaw`:
        :meth:`apply_gradients` drops their gradients, so they keep their initial value."""
        keys = check_keys(keys, self._where("freeze")).to(self.device)
        frozen = torch.zeros(self.device_cache.capacity_rows, dtype=torch.bool, device=self.device)
        frozen[self._staged_slots(keys, "freeze")] = True
        self._frozen = frozen if bool(frozen.any()) else None

    def thaw(self) -> None:
        """Every key takes updates again (the pass that froze some is counted)."""
        self._frozen = None

    # -- expiry (daskhps.table.expiry) ----------------------------------------------------

    def row_statistics(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(keys, count, last_day)`` of every row of the shard, each from its freshest copy
        (device, then host, then store; the store is read in blocks of rows). A resident key
        that is only initialised (clean, and not in the store) has no row and is left out."""
        width, at = self.spec.width, self.spec.stats_at
        parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        resident = [torch.empty(0, dtype=torch.int64)]
        for tier in [self.device_cache, self.host]:
            if tier is not None and len(tier):
                keys = tier.keys()  # read through slots: a scan must not count as a use
                slots = tier.find_slots(keys)
                resident.append(keys.cpu())
                real = self._has_row(tier, keys, slots)
                keys, slots = keys[real], slots[real]
                parts.append((keys.cpu(), tier.rows.index_select(0, slots).cpu()))
        stored = self.store.keys()
        held = torch.cat(resident)
        if len(held) and len(stored):
            stored = stored[~torch.isin(stored, held)]
        for a in range(0, len(stored), _ROWS_PER_SCAN):
            block = stored[a : a + _ROWS_PER_SCAN]
            parts.append((block, self.store.lookup(block).rows))
        keys = torch.cat([torch.empty(0, dtype=torch.int64), *(k for k, _ in parts)])
        rows = torch.cat([torch.empty(0, width), *(r for _, r in parts)])
        count, last = row_stats(rows, at)
        return keys, count.clone(), last.clone()

    def remove(self, keys: torch.Tensor) -> int:
        """Remove the rows of unique ``keys`` from every tier, as if never written (a deletion
        record in the store). A key staged for a pass keeps its slot, reset to its initial
        value and clean: it has no row, as a key never seen. Returns the rows removed."""
        self._check_writable("remove")
        keys = check_keys(keys, self._where("remove")).cpu()
        if not len(keys):
            return 0
        gone = torch.zeros(len(keys), dtype=torch.bool)
        dev = self.device_cache
        slots = dev.find_slots(keys.to(self.device)).cpu()
        on_device = slots >= 0
        if bool(on_device.any()):
            pinned = torch.zeros_like(on_device)
            pinned[on_device] = dev.pinned_at(slots[on_device].to(self.device)).cpu()
            dev.evict(keys=keys[on_device & ~pinned].to(self.device))
            staged = keys[pinned]
            if len(staged):
                dev.upsert(
                    staged.to(self.device),
                    initial_rows(self.spec, staged).to(self.device),
                    dirty=False,
                )
            gone |= on_device
        if self.host is not None:
            found = self.host.find_slots(keys) >= 0
            if bool(found.any()):
                self.host.evict(keys=keys[found])
                gone |= found
        in_store = self.store.contains(keys)
        self.store.delete(keys[in_store])
        return int((gone | in_store).sum())

    def _staged_slots(self, keys: torch.Tensor, op: str) -> torch.Tensor:
        slots = self.device_cache.find_slots(keys)
        if len(slots) and int(slots.min()) < 0:
            bad = int(keys[slots < 0][0])
            raise DataError(f"{self._where(op)}: key {bad} is not staged; stage the pass first")
        return slots

    # -- training ----------------------------------------------------------------

    def apply_gradients(self, keys: torch.Tensor, grads: torch.Tensor) -> None:
        """Sum the gradients of duplicate keys, then update each row's embedding and
        optimizer state in the device tier."""
        self._check_writable("apply_gradients")
        where = self._where("apply_gradients")
        keys = check_keys(keys, where).to(self.device)
        dim = self.spec.dim
        if not isinstance(grads, torch.Tensor) or grads.dtype != torch.float32:
            got = grads.dtype if isinstance(grads, torch.Tensor) else type(grads).__name__
            raise DataError(f"{where}: gradients must be a float32 tensor, got {got}")
        if grads.shape != (keys.shape[0], dim):
            raise DataError(
                f"{where}: gradients must have shape [{keys.shape[0]}, {dim}] "
                f"(one row of dim {dim} per key), got {tuple(grads.shape)}"
            )
        grads = grads.to(self.device)
        # One reduction (nan and inf propagate through min/max); the scan per row only to
        # name the bad key.
        if grads.numel() and not bool(torch.isfinite(torch.stack(torch.aminmax(grads))).all()):
            bad = int(keys[~torch.isfinite(grads).all(dim=1)][0])
            raise DataError(
                f"{where}: the gradient of key {bad} is not finite (nan or inf); "
                "nothing was applied: lower the learning rate or clip gradients"
            )
        ukeys, inv = _unique(keys)
        if inv is None:  # 0 + g: the bits index_add_ into zeros gives (-0.0 becomes 0.0)
            summed = grads + 0.0
        else:
            summed = torch.zeros(len(ukeys), dim, dtype=torch.float32, device=self.device)
            summed.index_add_(0, inv, grads)
        if self._frozen is not None:  # keys not admitted: no update
            slots = self.device_cache.find_slots(ukeys)
            keep = (slots < 0) | ~self._frozen[slots.clamp(min=0)]
            if not bool(keep.all()):
                ukeys, summed = ukeys[keep], summed[keep]
        self._update_resident(
            ukeys, "apply_gradients", lambda b: apply_update(self.spec.optimizer, b, summed, dim)
        )

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
        self._check_writable("record_seen")
        where = self._where("record_seen")
        keys = check_keys(keys, where).to(self.device)
        if counts is None:
            counts = torch.ones(len(keys), dtype=torch.int64, device=self.device)
        elif (
            not isinstance(counts, torch.Tensor)
            or counts.shape != keys.shape
            or counts.dtype not in (torch.int32, torch.int64)
        ):
            got = (
                f"{counts.dtype} {tuple(counts.shape)}"
                if isinstance(counts, torch.Tensor)
                else type(counts).__name__
            )
            raise DataError(
                f"{where}: counts must be an int32 or int64 tensor of shape {tuple(keys.shape)} "
                f"(one per key), got {got}"
            )
        counts = counts.to(device=self.device, dtype=torch.int64)
        if len(counts) and int(counts.min()) < 0:
            bad = int(keys[counts < 0][0])
            raise DataError(f"{where}: the count of key {bad} is negative; nothing was counted")
        if isinstance(days, torch.Tensor):
            if days.shape != keys.shape:
                raise DataError(
                    f"{where}: days must be one per key, shape {tuple(keys.shape)}, or one int; "
                    f"got shape {tuple(days.shape)}"
                )
            days = days.to(device=self.device, dtype=torch.int32)
        ukeys, inv = _unique(keys)
        if inv is not None:
            counts = torch.zeros(len(ukeys), dtype=torch.int64, device=self.device).index_add_(
                0, inv, counts
            )
            if isinstance(days, torch.Tensor):
                days = torch.zeros(
                    len(ukeys), dtype=torch.int32, device=self.device
                ).scatter_reduce_(0, inv, days, reduce="amax")
        self._update_resident(
            ukeys, "record_seen", lambda b: record(b, self.spec.stats_at, counts, days)
        )

    def _update_resident(
        self, ukeys: torch.Tensor, what: str, update: Callable[[torch.Tensor], None]
    ) -> None:
        """Make the rows of unique ``ukeys`` resident, ``update`` their block in place and
        write it back to the device tier, dirty."""
        slots = self._resident_slots(ukeys, what)
        slab = self.device_cache.rows
        block = slab.index_select(0, slots)
        update(block)
        slab.index_copy_(0, slots, block)
        self.device_cache.mark_dirty(slots)

    # -- persistence -------------------------------------------------------------

    def flush(self) -> int:
        """Append every dirty row of the device and host tiers to the store; returns rows
        written. The rows stay resident, now clean."""
        self._check_writable("flush")
        parts = [self.device_cache.flush().to("cpu")]
        if self.host is not None:
            parts.append(self.host.flush())
        dirty = Evicted.concat(parts, self.spec.width)
        if len(dirty):
            self.store.upsert(dirty.keys, dirty.rows)
        self.store.flush()
        return len(dirty)

    def commit(
        self,
        name: str,
        meta: dict[str, Any] | None = None,
        attach: Mapping[str, np.ndarray] | None = None,
    ) -> CommitInfo:
        """Flush, then record a named commit point in the store (carrying ``attach``: see
        :meth:`PersistentStore.commit`)."""
        self.flush()
        return self.store.commit(name, meta, attach)

    def commits(self) -> list[CommitInfo]:
        return self.store.commits()

    def close(self, *, uncommitted: Literal["warn", "drop"] = "warn") -> None:
        """Release the store's lock. Rows changed since the last commit are not kept: a
        warning says how many, unless ``uncommitted="drop"`` (a caller that restarts from its
        last commit anyway, such as an interrupted training run) says so on purpose."""
        if not self._read_only:
            dirty = self.device_cache.stats.extra["dirty_rows"]
            if self.host is not None:
                dirty += self.host.stats.extra["dirty_rows"]
            if dirty:
                log.log(
                    logging.WARNING if uncommitted == "warn" else logging.DEBUG,
                    "closing table %r with %d rows changed since its last commit; "
                    "call commit() first to keep them",
                    self.spec.name,
                    int(dirty),
                )
        self.device_cache.close()
        if self.host is not None:
            self.host.close()
        self.store.close()

    def __enter__(self) -> EmbeddingTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- introspection -----------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters per tier and where looked-up rows came from."""
        total = sum(self._sources.values())
        out: dict[str, Any] = {
            "rows_from": dict(self._sources),
            "hit_rate": {k: (v / total if total else 0.0) for k, v in self._sources.items()},
            "device": self.device_cache.stats.as_dict(),
            "store": self.store.stats.as_dict(),
            "pinned": self.device_cache.pinned_count,
        }
        if self.host is not None:
            out["host"] = self.host.stats.as_dict()
        return out

    # -- internals ---------------------------------------------------------------

    def _where(self, op: str) -> str:
        return f"table {self.spec.name!r} ({self.store.path}), {op}"

    def _check_writable(self, op: str) -> None:
        if self._read_only:
            raise DataError(
                f"{self._where(op)}: the table was opened read-only (mode='r'); "
                "open it with mode='a' to train, or use lookup(keys, read_only=True)"
            )

    def _resident_slots(self, ukeys: torch.Tensor, op: str) -> torch.Tensor:
        """Device slots of unique keys, promoting missing rows from below first."""
        cache = self.device_cache
        slots = cache.find_slots(ukeys, touch=True)
        hit = slots >= 0
        n_hit = int(hit.sum())
        self._sources["device"] += n_hit
        if n_hit == len(ukeys):
            return slots
        hit_slots = slots[hit]
        # This batch's resident rows must not be displaced by its own missing ones (LFU could
        # pick them): pin them for the insert, then release only those pins.
        fresh = hit_slots[~cache.pinned_at(hit_slots)]
        pinned = cache.pinned_count
        unpinned = len(ukeys) - (n_hit - len(fresh))
        if unpinned > cache.capacity_rows - pinned:
            raise CapacityError(
                f"{self._where(op)}: {len(ukeys):,} unique keys ({unpinned:,} not pinned) do not "
                f"fit the device tier of {cache.capacity_rows:,} rows with {pinned:,} "
                "pinned; stage the pass's keys first, use smaller batches or a larger device tier"
            )
        miss = ~hit
        cache.pin_slots(fresh)
        try:
            new_slots = self._promote(ukeys[miss])
        finally:
            cache.unpin_slots(fresh)
        slots = slots.clone()
        slots[miss] = new_slots
        return slots

    def _promote(self, mkeys: torch.Tensor) -> torch.Tensor:
        """Bring unique keys missing from the device tier into it (displacing unpinned rows
        down the hierarchy, see :mod:`daskhps.table.read_path`); returns their slots. The
        caller checked that they fit."""
        return self._read.promote(mkeys)[0]


def open_shard_store(
    spec: TableSpec, path: str | Path, *, label: str | None = None, **kwargs: Any
) -> StoreReader:
    """The zarr store of one shard of ``spec``'s table at ``path``, with the table's row width
    and layout (a store written with another layout is refused); ``kwargs`` go to
    :func:`daskhps.tiers.store.open_store` (``mode``, ``commit``, ...): a reader for
    ``mode="r"``, else a writer. ``label`` names it in messages (default ``<table>/zarr``)."""
    return open_store(
        path,
        name=label or f"{spec.name}/zarr",
        width=spec.width,
        layout=spec.layout(),
        **kwargs,
    )


def _unique(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``torch.unique(keys, return_inverse=True)``, with ``None`` for the inverse when ``keys``
    are already strictly increasing (what :meth:`Exchange.route` hands each owner): one
    comparison instead of a sort."""
    if keys.numel() < 2 or bool((keys[1:] > keys[:-1]).all()):
        return keys, None
    ukeys, inv = torch.unique(keys, return_inverse=True)
    return ukeys, inv

"""The serving lookup: ``keys -> rows`` through a read-only hierarchy, refreshed by deltas.

::

    lookup(keys)   unique keys ──► device cache (LRU) ──hit──────────────────────► rows
                                     │ miss
                                     ▼
                                   host memory (LRU) ──hit (moved up)──┐
                                     │ miss                           ▼
                                   rank stores, mode "r" ──(copied up)──► device cache
                                     │ unseen key                     ▲
                                   init(seed, key) ───────────────────┘
    rows displaced from the device cache go to host memory; rows displaced from host memory
    are dropped (every cached row is clean: the store or init gives it back).

    refresh(newer)  open the newer commit's stores (their key index, no rows)
                    changed = keys of segments only one of the two commits uses
                    cached rows of changed keys are re-read and replaced; nothing else moves

Like HugeCTR's HPS, the caches are the serving node's view of the whole table; the stores
are never written. Not thread-safe: callers that share a lookup between threads hold a lock.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

import torch

from daskhps.errors import DaskHPSError
from daskhps.serve.stores import ShardedStores
from daskhps.serve.version import TableVersion
from daskhps.tiers._slots import SlotCache
from daskhps.tiers.base import check_keys
from daskhps.tiers.device import DeviceCache
from daskhps.tiers.host import HostMemory, rows_for_bytes

__all__ = ["RefreshReport", "ServingLookup"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RefreshReport:
    """What :meth:`ServingLookup.refresh` did.

    Attributes
    ----------
    old_commit, new_commit:
        The versions before and after.
    changed_keys:
        Keys in the delta (segments written between the two commits, or used only by the
        older); every stored key when ``full``.
    replaced_rows:
        Cached rows of changed keys, re-read from the newer version and replaced.
    rows_read:
        Rows the refresh read from the stores (equals ``replaced_rows`` minus rows that are
        now unseen and come from init).
    full:
        True when no delta could be taken (another sharding, or the older commit's files
        are gone) and the caches were emptied instead.
    seconds:
        Wall time of the refresh.
    """

    old_commit: str
    new_commit: str
    changed_keys: int
    replaced_rows: int
    rows_read: int
    full: bool
    seconds: float


class ServingLookup:
    """Read-only ``keys -> rows`` over every rank store of a table version, with caches.

    Parameters
    ----------
    version:
        The table version to serve (see :class:`TableVersion`).
    device_rows:
        Rows of the device cache (at least 1).
    host_bytes:
        Budget of the host-memory cache in bytes; 0 for none.
    device:
        Where the device cache lives (``"cpu"``, ``"cuda"``); results are returned there.
    policy:
        Replacement policy of both caches, ``"lru"`` (default) or ``"lfu"``.
    """

    def __init__(
        self,
        version: TableVersion,
        *,
        device_rows: int,
        host_bytes: int = 0,
        device: str | torch.device = "cpu",
        policy: Literal["lru", "lfu"] = "lru",
    ) -> None:
        self.spec = version.spec
        name, width = self.spec.name, self.spec.width
        self.device_cache = DeviceCache(
            f"{name}/serve-device", width, device_rows, device=device, policy=policy
        )
        self.host: HostMemory | None = None
        if host_bytes and rows_for_bytes(width, host_bytes, policy) > 0:
            self.host = HostMemory(f"{name}/serve-host", width, host_bytes, policy=policy)
        self.device = self.device_cache.device
        self._stores = ShardedStores(version)
        self._rows_from = {"device": 0, "host": 0, "store": 0, "init": 0}
        self._store_rows_read = 0  # of stores closed by refresh

    @property
    def version(self) -> TableVersion:
        return self._stores.version

    # -- lookups ---------------------------------------------------------------------------

    def lookup(self, keys: torch.Tensor, *, full: bool = False) -> torch.Tensor:
        """Rows of ``keys`` (any shape of int64 keys flattened; duplicates allowed).

        Returns ``float32[n, dim]`` embedding columns, or with ``full`` the whole rows
        (embedding and optimizer state, ``[n, width]``), on :attr:`device`.
        """
        keys = check_keys(keys, f"table {self.spec.name!r}: serving lookup").to(self.device)
        ukeys, inv = torch.unique(keys, return_inverse=True)
        got = self.device_cache.lookup(ukeys)
        rows, found = got.rows, got.found
        n_hit = int(found.sum())
        self._rows_from["device"] += n_hit
        if n_hit < len(ukeys):
            miss = (~found).nonzero().squeeze(1)
            rows[miss] = self._fill(ukeys[miss])
        out = rows[inv]
        return out if full else out[:, : self.spec.dim]

    def _fill(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows of device-missing keys from host memory or the stores, then cached."""
        n = len(keys)
        ckeys = keys.cpu()
        rows = torch.empty(n, self.spec.width, dtype=torch.float32)
        todo = torch.ones(n, dtype=torch.bool)
        if self.host is not None and len(self.host):
            got = self.host.lookup(ckeys)
            rows[got.found] = got.rows[got.found]
            todo &= ~got.found
            self.host.evict(keys=ckeys[got.found])  # exclusive tiers: it moves up
            self._rows_from["host"] += int(got.found.sum())
        rest = todo.nonzero().squeeze(1)
        if len(rest):
            before = self._stores.initialised
            rows[rest] = self._stores.read(ckeys[rest])
            fresh = self._stores.initialised - before
            self._rows_from["init"] += fresh
            self._rows_from["store"] += len(rest) - fresh
        self._cache(ckeys, rows)
        return rows.to(self.device)

    def _cache(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Put rows in the device cache; what that displaces, and the rows of a batch larger
        than the device cache, go to host memory (as many as it holds)."""
        cap = self.device_cache.capacity_rows
        displaced = self.device_cache.upsert(
            keys[:cap].to(self.device), rows[:cap].to(self.device), dirty=False
        )
        if self.host is None:
            return
        down_keys = torch.cat([displaced.keys.cpu(), keys[cap:]])
        down_rows = torch.cat([displaced.rows.cpu(), rows[cap:]])
        hcap = self.host.capacity_rows
        self.host.upsert(down_keys[:hcap], down_rows[:hcap], dirty=False)

    # -- refresh ---------------------------------------------------------------------------

    def refresh(self, version: TableVersion) -> RefreshReport:
        """Move to ``version`` (a newer commit of the same stores, usually) through its delta.

        Only cached rows of keys in the delta are re-read and replaced; every other cached
        row stays. When no delta exists (another sharding, or the current commit's files
        were deleted by the trainer keeping fewer checkpoints) the caches are emptied.
        Lookups after the call return the rows of ``version``, bit for bit.
        """
        t = time.perf_counter()
        old = self._stores
        new = ShardedStores(version)
        full = False
        replaced = 0
        read_before = new.rows_read
        try:
            changed = old.changed_keys(new)
        except (DaskHPSError, OSError) as e:
            log.warning("refresh to %s without a delta (caches emptied): %s", version.describe(), e)
            changed, full = None, True
        if changed is None:
            for cache in self._caches():
                cache.evict(keys=cache.keys())
            n_changed = len(new)
        else:
            n_changed = len(changed)
            for cache in self._caches():
                replaced += _replace(cache, changed, new)
        rows_read = new.rows_read - read_before
        self._store_rows_read += old.rows_read
        old.close()
        self._stores = new
        return RefreshReport(
            old_commit=old.version.commit,
            new_commit=version.commit,
            changed_keys=n_changed,
            replaced_rows=replaced,
            rows_read=rows_read,
            full=full,
            seconds=time.perf_counter() - t,
        )

    def _caches(self) -> list[SlotCache]:
        return [self.device_cache] + ([self.host] if self.host is not None else [])

    # -- introspection ---------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Where looked-up rows came from, cache counters, rows read from the stores."""
        total = sum(self._rows_from.values())
        out: dict[str, Any] = {
            "commit": self.version.commit,
            "rows_from": dict(self._rows_from),
            "hit_rate": {k: v / total if total else 0.0 for k, v in self._rows_from.items()},
            "store_rows_read": self._store_rows_read + self._stores.rows_read,
            "device": self.device_cache.stats.as_dict(),
        }
        if self.host is not None:
            out["host"] = self.host.stats.as_dict()
        return out

    def close(self) -> None:
        self._stores.close()
        for cache in self._caches():
            cache.close()

    def __enter__(self) -> ServingLookup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _replace(cache: SlotCache, changed: torch.Tensor, stores: ShardedStores) -> int:
    """Overwrite the cached rows of ``changed`` keys with ``stores``' rows; returns how many."""
    if not len(changed) or not len(cache):
        return 0
    keys = changed.to(cache.device)
    cached = keys[cache.find_slots(keys) >= 0]
    if len(cached):
        # Every key is present, so the upsert overwrites in place and displaces nothing.
        cache.upsert(cached, stores.read(cached.cpu()).to(cache.device), dirty=False)
    return len(cached)

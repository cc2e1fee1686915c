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
    are dropped (every cached row is clean: the store or init gives it back). Everything
    below the device hit is the table's read path (daskhps.table.read_path) with the rank
    stores below and no write-back.

    refresh(newer)  replay the key arrays of the segments the newer commit adds over the
                    key index in memory (a rollback or branch: open its index instead)
                    changed = keys of segments only one of the two commits uses
                    cached rows of changed keys are re-read and replaced; nothing else moves

    prepare(newer)  the same in two halves, for a server that must not stop serving: open the
      refresh(p)    newer commit's stores beside the served ones and diff segment sets (any
                    thread, lookups go on; a second key index in memory meanwhile), then only
                    swap the stores and replace the cached rows of changed keys

Like HugeCTR's HPS, the caches are the serving node's view of the whole table; the stores
are never written. Not thread-safe: callers that share a lookup between threads hold a lock.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

import torch

from daskhps.errors import DaskHPSError, DataError, StoreMismatchError
from daskhps.serve.stores import ShardedStores
from daskhps.serve.version import TableVersion
from daskhps.table.read_path import ReadPath, read_below
from daskhps.tiers.base import Cache, check_keys
from daskhps.tiers.device import DeviceCache
from daskhps.tiers.host import HostMemory, rows_for_bytes

__all__ = ["PreparedRefresh", "RefreshReport", "ServingLookup"]

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
        older); every stored key when ``how`` is ``"full"``.
    replaced_rows:
        Cached rows of changed keys, re-read from the newer version and replaced.
    rows_read:
        Rows the refresh read from the stores (equals ``replaced_rows`` minus rows that are
        now unseen and come from init).
    how:
        ``"replay"``: the newer commit extends the older, its added segments were replayed
        over the key index in memory; ``"diff"``: the newer commit's index was opened and
        segment sets diffed (a rollback or branch); ``"full"``: no delta (another sharding,
        or the older commit's files are gone), the caches were emptied.
    seconds:
        Wall time of the refresh.
    """

    old_commit: str
    new_commit: str
    changed_keys: int
    replaced_rows: int
    rows_read: int
    how: Literal["replay", "diff", "full"]
    seconds: float


@dataclass
class PreparedRefresh:
    """The half of a refresh :meth:`ServingLookup.prepare` did beside the lookups: the newer
    version's stores, open, and the keys whose row may differ from the served version's
    (``None``: no delta, the caches will be emptied)."""

    version: TableVersion
    stores: ShardedStores
    base: str  # the commit the delta is from
    changed: torch.Tensor | None
    how: Literal["diff", "full"]
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
    full_rows:
        Cache and return whole rows (embedding and optimizer state); by default only the
        ``dim`` columns the model reads, which holds 2x (Adagrad) to 3x (Adam) more rows in
        the same memory.
    """

    def __init__(
        self,
        version: TableVersion,
        *,
        device_rows: int,
        host_bytes: int = 0,
        device: str | torch.device = "cpu",
        policy: Literal["lru", "lfu"] = "lru",
        full_rows: bool = False,
    ) -> None:
        self.spec = version.spec
        self.width = width = self.spec.width if full_rows else self.spec.dim
        name = self.spec.name
        self.device_cache = DeviceCache(
            f"{name}/serve-device", width, device_rows, device=device, policy=policy
        )
        self.host: HostMemory | None = None
        if host_bytes and rows_for_bytes(width, host_bytes, policy) > 0:
            self.host = HostMemory(f"{name}/serve-host", width, host_bytes, policy=policy)
        self.device = self.device_cache.device
        self._stores = ShardedStores(version)
        # Every cached row is clean (the stores are never written): no write-back.
        self._read = ReadPath(self.spec, self.device_cache, self.host, self._stores)
        self._rows_from = self._read.rows_from
        self._store_rows_read = 0  # of stores closed by refresh

    @property
    def version(self) -> TableVersion:
        return self._stores.version

    # -- lookups ---------------------------------------------------------------------------

    def lookup(self, keys: torch.Tensor, *, unique: bool = False) -> torch.Tensor:
        """Rows of int64 ``keys`` (1-D; duplicates allowed), ``float32[n, width]`` on
        :attr:`device`: the embedding columns (``width == spec.dim``), or whole rows with
        ``full_rows``. ``unique`` promises that ``keys`` hold no duplicate (as a batch
        routed by :class:`~daskhps.distributed.Exchange` does), which skips deduplicating.
        """
        keys = check_keys(keys, f"table {self.spec.name!r}: serving lookup").to(self.device)
        if unique:
            ukeys, inv = keys, None
        else:
            ukeys, inv = torch.unique(keys, return_inverse=True)
        got = self.device_cache.lookup(ukeys)
        rows, found = got.rows, got.found
        n_hit = int(found.sum())
        self._rows_from["device"] += n_hit
        if n_hit < len(ukeys):
            miss = (~found).nonzero().squeeze(1)
            mkeys = ukeys[miss]
            if unique:
                _check_unique(mkeys, self.spec.name)
            rows[miss] = self._read.promote(mkeys)[1]
        return rows if inv is None else rows[inv]

    # -- refresh ---------------------------------------------------------------------------

    def prepare(self, version: TableVersion) -> PreparedRefresh:
        """Open ``version`` beside the served stores and find the keys whose row may differ
        (a diff of segment sets: keys of segments only one of the two uses). Safe on another
        thread while lookups go on: nothing served changes. :meth:`refresh` with the result
        then holds lookups only for swapping the stores and replacing cached rows."""
        t = time.perf_counter()
        if version.spec != self.spec:
            raise StoreMismatchError(
                f"no refresh from table {self.spec.name!r} to {version.describe()}: the row "
                "layout differs; open a new lookup on the newer version instead"
            )
        old = self._stores
        new = ShardedStores(version)
        changed, how = _diff(old, old.segment_ids(), new)
        return PreparedRefresh(
            version, new, old.version.commit, changed, how, time.perf_counter() - t
        )

    def _refresh_prepared(self, p: PreparedRefresh) -> RefreshReport:
        t = time.perf_counter()
        old = self._stores
        old_commit, changed, how = old.version.commit, p.changed, p.how
        if old_commit != p.base:  # refreshed since it was prepared: the delta is from there
            changed, how = _diff(old, old.segment_ids(), p.stores)
        read_before = p.stores.rows_read
        self._use(p.stores)
        return RefreshReport(
            old_commit=old_commit,
            new_commit=p.version.commit,
            changed_keys=len(p.stores) if changed is None else len(changed),
            replaced_rows=self._renew(changed),
            rows_read=p.stores.rows_read - read_before,
            how=how,
            seconds=time.perf_counter() - t,
        )

    def _use(self, stores: ShardedStores) -> None:
        """Read from ``stores`` from now on; the served ones are closed."""
        old = self._stores
        self._store_rows_read += old.rows_read
        old.close()
        self._stores = self._read.below = stores

    def _renew(self, changed: torch.Tensor | None) -> int:
        """Re-read the cached rows of ``changed`` keys (None: empty the caches); how many."""
        replaced = 0
        for cache in self._caches():
            if changed is None:
                cache.evict(keys=cache.keys())
            else:
                replaced += _replace(cache, changed, self._read)
        return replaced

    def refresh(self, version: TableVersion | PreparedRefresh) -> RefreshReport:
        """Move to ``version`` (a newer commit of the same stores, usually) through its delta.

        Only cached rows of keys in the delta are re-read and replaced; every other cached
        row stays. A commit that extends the current one (the usual next checkpoint) is
        reached by replaying the segments it adds over the key index in memory; any other
        (a rollback, a branch) by opening its index and diffing segment sets. When no delta
        exists (another sharding, or the current commit's files were deleted because the
        trainer keeps fewer checkpoints) the caches are emptied. Lookups after the call
        return the rows of ``version``, bit for bit.

        Given what :meth:`prepare` returned, it only swaps the stores and replaces the cached
        rows of the changed keys (``seconds`` then counts this half alone).
        """
        if isinstance(version, PreparedRefresh):
            return self._refresh_prepared(version)
        t = time.perf_counter()
        old = self._stores
        old_commit = old.version.commit
        read_before = old.rows_read
        before = old.segment_ids()
        changed: torch.Tensor | None
        how: Literal["replay", "diff", "full"] = "replay"
        try:
            changed, new = old.advance(version), old
        except StoreMismatchError:
            new = ShardedStores(version)
            read_before = new.rows_read
            changed, how = _diff(old, before, new)
            self._use(new)
        return RefreshReport(
            old_commit=old_commit,
            new_commit=version.commit,
            changed_keys=len(new) if changed is None else len(changed),
            replaced_rows=self._renew(changed),
            rows_read=new.rows_read - read_before,
            how=how,
            seconds=time.perf_counter() - t,
        )

    def _caches(self) -> list[Cache]:
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


def _diff(
    old: ShardedStores, before: list[frozenset[int]], new: ShardedStores
) -> tuple[torch.Tensor | None, Literal["diff", "full"]]:
    """The keys whose row may differ between ``old`` at the segments ``before`` and ``new``,
    and how they were found; None (logged) when no delta exists: the caches are emptied."""
    try:
        return old.changed_keys(before, new), "diff"
    except (DaskHPSError, OSError) as e:
        log.warning("refresh to %s without a delta: caches emptied (%s)", new.version.describe(), e)
        return None, "full"


def _replace(cache: Cache, changed: torch.Tensor, path: ReadPath) -> int:
    """Overwrite the cached rows of ``changed`` keys with the rows below ``path`` (the newer
    version's stores, or init); returns how many."""
    if not len(changed) or not len(cache):
        return 0
    keys = changed.to(cache.device)
    cached = keys[cache.find_slots(keys) >= 0]
    if len(cached):
        # Every key is present, so the upsert overwrites in place and displaces nothing.
        rows, _ = read_below(path.spec, path.below, cached.cpu(), path.width)
        cache.upsert(cached, rows.contiguous().to(cache.device), dirty=False)
    return len(cached)


def _check_unique(keys: torch.Tensor, table: str) -> None:
    """Refuse a batch promised unique that is not: the caches index one row per key."""
    if len(keys) < 2 or bool((keys[1:] > keys[:-1]).all()):  # sorted (a routed batch)
        return
    s = keys.sort().values
    dup = (s[1:] == s[:-1]).nonzero()
    if len(dup):
        raise DataError(
            f"table {table!r}: serving lookup(unique=True) got key {int(s[dup[0, 0]])} more "
            "than once; pass unique=False (the default) to deduplicate"
        )

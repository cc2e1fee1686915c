"""The bottom of the serving hierarchy: every rank store of a table version, read-only.

::

    keys ──ShardMap.worker──► rank 0 store (mode "r", commit c) ──found──► rows
                              rank 1 store ...                 ──missing─► init(seed, key)

:class:`ShardedStores` is what sits below the caches on serving's read path
(:mod:`daskhps.table.read_path`, the table's own): its ``lookup`` reads the rank stores, and
the read path gives keys none of them holds their initial rows.

Stores are opened with ``mode="r"``: no lock is taken and nothing is ever written, so a
trainer may keep appending and committing while a reader serves an earlier commit.
"""

from __future__ import annotations

import torch

from daskhps.errors import StoreCorruptedError, StoreMismatchError, StoreNotFoundError
from daskhps.serve.version import TableVersion
from daskhps.table.read_path import read_below
from daskhps.table.table import open_shard_store
from daskhps.tiers.base import Lookup, check_keys
from daskhps.tiers.store import StoreReader
from daskhps.tiers.store.check import StoreChecker

__all__ = ["ShardedStores", "check_stores"]


def check_stores(version: TableVersion, model: str) -> None:
    """Fail before any work starts when a rank store of ``version`` is missing, lacks the
    commit, or has a file that its metadata says should be longer or exist (one ``stat``
    per file, no row read); a cluster's workers would otherwise find it one by one.

    Raises
    ------
    StoreNotFoundError
        A rank store does not exist.
    StoreCorruptedError
        Any other problem; the message names the first file and how many more there are.
    """
    for rank in range(version.num_workers):
        path = version.store_path(rank)
        if not (path / "zarr.json").is_file():
            raise StoreNotFoundError(
                f"model {model!r}: no store at {path} (rank {rank} of {version.describe()}); "
                "the stores were moved or deleted, or are not reachable from here: give a "
                "model whose stores exist"
            )
    ranks = [version.store_path(r) for r in range(version.num_workers)]
    damage = StoreChecker().rank_damage(ranks, version.commit)
    if damage:
        more = f" (and {len(damage) - 1} more problem(s))" if len(damage) > 1 else ""
        raise StoreCorruptedError(
            f"model {model!r}: cannot read {version.describe()}: {damage[0]}{more}; use an "
            "intact checkpoint (--checkpoint NAME; `daskhps inspect RUN_DIR` says which are "
            "intact) or restore the stores from a backup"
        )


class ShardedStores:
    """Read-only rows of one :class:`TableVersion`, over all its rank stores."""

    def __init__(self, version: TableVersion) -> None:
        self.version = version
        self.spec = version.spec
        self.stores: list[StoreReader] = []
        self.initialised = 0  # rows served from init (keys no store holds)
        try:
            for rank in range(version.num_workers):
                self.stores.append(self._open(rank, version))
        except BaseException:
            self.close()
            raise

    def _open(self, rank: int, version: TableVersion) -> StoreReader:
        return open_shard_store(
            self.spec,
            version.store_path(rank),
            label=f"{self.spec.name}/zarr rank-{rank}",
            mode="r",
            commit=version.commit,
        )

    @property
    def rows_read(self) -> int:
        """Rows read from the stores since opening."""
        return sum(s.stats.rows_read for s in self.stores)

    def __len__(self) -> int:
        return sum(len(s) for s in self.stores)

    def lookup(self, keys: torch.Tensor, *, out: torch.Tensor | None = None) -> Lookup:
        """Full rows of unique CPU ``keys`` from their rank stores (zero where no store holds
        the key, ``found`` False); ``out`` is an optional ``float32[n, width]`` to fill."""
        if len(self.stores) == 1:
            return self.stores[0].lookup(keys, out=out)
        rows = torch.empty(len(keys), self.spec.width, dtype=torch.float32) if out is None else out
        found = torch.zeros(len(keys), dtype=torch.bool)
        owner = self.version.shard_map.worker(keys)
        order = torch.argsort(owner, stable=True)
        counts = torch.bincount(owner, minlength=len(self.stores)).tolist()
        for store, idx in zip(self.stores, order.split(counts), strict=True):
            if len(idx):
                got = store.lookup(keys[idx])
                rows[idx] = got.rows
                found[idx] = got.found
        return Lookup(rows, found)

    def read(self, keys: torch.Tensor) -> torch.Tensor:
        """Full rows of unique ``keys`` (CPU ``float32[n, width]``); unseen keys read their
        initial value."""
        keys = check_keys(keys, f"table {self.spec.name!r}: read").cpu()
        rows, fresh = read_below(self.spec, self, keys, self.spec.width)
        self.initialised += fresh
        return rows

    def _check_delta(self, version: TableVersion) -> None:
        a, b = self.version, version
        if (a.spec, a.num_workers, a.num_shards) != (b.spec, b.num_workers, b.num_shards):
            raise StoreMismatchError(
                f"no delta from {a.describe()} to {b.describe()}: the table layout or the "
                "sharding differs; open a new lookup on the newer version instead"
            )

    def segment_ids(self) -> list[frozenset[int]]:
        """Per rank, the segments the open state reads rows from."""
        return [s.segment_ids for s in self.stores]

    def advance(self, version: TableVersion) -> torch.Tensor:
        """Move every rank store to ``version``'s commit in place, replaying only the
        segments it adds (:meth:`StoreReader.advance`); returns the unique keys whose row may
        differ.

        Raises
        ------
        StoreMismatchError
            No delta: another layout or sharding, or a commit that does not extend the open
            one. On this or any other error every rank is back at the open version (ranks
            already advanced are reopened at it).
        """
        self._check_delta(version)
        parts = [torch.empty(0, dtype=torch.int64)]
        for rank, store in enumerate(self.stores):
            try:
                parts.append(store.advance(version.commit))
            except BaseException:
                for back in range(rank):
                    self.stores[back].close()
                    self.stores[back] = self._open(back, self.version)
                raise
        self.version = version
        return torch.unique(torch.cat(parts))

    def changed_keys(self, before: list[frozenset[int]], newer: ShardedStores) -> torch.Tensor:
        """Unique keys whose row may differ between a state of these stores that used the
        segments ``before`` (per rank, from :meth:`segment_ids`) and ``newer``: those of the
        segments only one of them uses. Reads key arrays, no rows.

        Raises
        ------
        StoreMismatchError
            The versions do not share a table layout and sharding (no delta exists).
        StoreCorruptedError
            A segment only the older state used was deleted (its commit was dropped).
        """
        self._check_delta(newer.version)
        parts = [torch.empty(0, dtype=torch.int64)]
        for mine, new in zip(before, newer.stores, strict=True):
            theirs = new.segment_ids
            if mine - theirs:
                parts.append(new.segment_keys(mine - theirs))  # same folder, any segment
            if theirs - mine:
                parts.append(new.segment_keys(theirs - mine))
        return torch.unique(torch.cat(parts))

    def close(self) -> None:
        for s in self.stores:
            s.close()
        self.stores = []

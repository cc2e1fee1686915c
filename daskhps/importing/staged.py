"""The rank stores an import writes, in a staging folder until everything is written.

Each chunk's rows go to the store of their owner rank, ``ShardMap(num_shards,
workers).worker(key)`` as in training, one ``argsort`` per chunk. A key repeated across chunks
is caught where it would be written: the owner's store already holds it (its key index says
so; no row is read), so the check costs one index probe per key and no memory beyond the
stores' own indexes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from daskhps._paths import tree_bytes
from daskhps.importing.source import Chunk
from daskhps.sharding import ShardMap
from daskhps.table.optimizers import init_state
from daskhps.table.spec import TableSpec
from daskhps.table.table import open_shard_store
from daskhps.tiers.base import PersistentStore
from daskhps.tiers.store import StoreOptions
from daskhps.tiers.store.check import CommitId

__all__ = ["RepeatedKey", "StagedStores"]

_SEGMENT_ROWS = StoreOptions().write_buffer_rows  # the most rows the store buffers per segment


class RepeatedKey(Exception):
    """A key an earlier chunk already wrote: ``key`` and where it appears again (``row``).
    Internal: the import turns it into one line naming both rows."""

    def __init__(self, key: int, row: str) -> None:
        super().__init__(key, row)
        self.key, self.row = key, row


class StagedStores:
    """One new store per rank under ``root/<table>/rank-<r>``, written chunk by chunk."""

    def __init__(self, spec: TableSpec, shard_map: ShardMap, root: Path, chunk_rows: int) -> None:
        self.spec = spec
        self.shard_map = shard_map
        self.root = root
        # Every optimizer starts every row in the same state, so one row of it serves all.
        self.initial_state = init_state(spec.optimizer, 1, spec.dim, torch.device("cpu")).numpy()
        self.stores: list[PersistentStore] = []
        try:
            for r in range(shard_map.num_workers):
                self.stores.append(
                    open_shard_store(
                        spec,
                        self.path(r),
                        label=f"{spec.name}/zarr rank-{r}",
                        mode="w",
                        # A segment (one import chunk's rows of a rank) in one chunk file:
                        # zarr pads a segment's last chunk file to full size, which would
                        # cost up to a third more disk with the store's default.
                        options=StoreOptions(chunk_rows=max(chunk_rows, _SEGMENT_ROWS)),
                    )
                )
        except BaseException:
            self.close()
            raise

    def path(self, rank: int) -> Path:
        return self.root / self.spec.name / f"rank-{rank}"

    def write(self, chunk: Chunk) -> None:
        """Route ``chunk``'s rows (weights, then the given or the initial optimizer state) to
        their owners' stores; :class:`RepeatedKey` when an earlier chunk wrote one of its
        keys. The chunk's own keys must be distinct (checked before)."""
        spec, keys = self.spec, chunk.keys
        owner = np.asarray(self.shard_map.worker(keys))
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=len(self.stores))
        routed = keys[order]
        rows = np.empty((len(keys), spec.width), dtype=np.float32)
        rows[:, : spec.dim] = chunk.weights[order]
        if spec.stats_at > spec.dim:
            state = self.initial_state if chunk.state is None else chunk.state[order]
            rows[:, spec.dim : spec.stats_at] = state
        rows[:, spec.stats_at :] = 0  # never counted: daskhps.table.stats
        at = 0
        for store, n in zip(self.stores, counts.tolist(), strict=True):
            if n:
                part = torch.from_numpy(routed[at : at + n])
                seen = store.contains(part).numpy()
                if seen.any():
                    i = int(order[at + np.flatnonzero(seen)].min())
                    raise RepeatedKey(int(keys[i]), chunk.key_row(i))
                store.upsert(part, torch.from_numpy(rows[at : at + n]))
            at += n

    def finish(self, commit: str, meta: dict[str, object]) -> list[dict[str, Any]]:
        """Commit every store as ``commit`` with a full index snapshot (a "base" state: a
        reopen loads one array instead of replaying every chunk's segment); per rank, its
        rows and bytes on disk."""
        out = []
        for r, store in enumerate(self.stores):
            store.compact()  # nothing is stale, so nothing moves: it only forces the snapshot
            info = store.commit(commit, meta)
            out.append(
                {
                    "rank": r,
                    "rows": len(store),
                    "store_bytes": tree_bytes(self.path(r)),
                    # the commit's identity, as a checkpoint records it
                    **CommitId(info.seq, info.time, info.rows).to_json(),
                }
            )
        return out

    def close(self) -> None:
        for s in self.stores:
            s.close()
        self.stores = []

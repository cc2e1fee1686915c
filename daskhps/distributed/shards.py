"""WorkerShards: one worker's shard of every table of a run, each behind its own lock.

::

    RunHost (worker plugin, one per run)
      └─ WorkerShards
           tables[t]  EmbeddingTable.open(<stores_dir>/<t>/rank-<r>)   device -> host -> store
           locks[t]   held by every call below: staging the next pass (one worker thread)
                      and training the current one (another) share the table

    open ─► stage / try_stage (pin a pass's keys) ─► lookup / apply_gradients (a pass trains)
        ─► unpin ─► flush / commit / compact / drop_commits_before (checkpoints) ─► close

The client calls every verb on all ranks at once through
:meth:`daskhps.distributed.RunGroup.on_shards` (``group.on_shards(WorkerShards.commit, name)``):
there is no per-verb task function or client wrapper. Stores are keyed by rank, so a restart
with the same number of workers finds each shard where it left it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from daskhps.distributed._errors import ClusterError
from daskhps.distributed.sizing import TierSizing
from daskhps.errors import CapacityError
from daskhps.monitor import stage_span
from daskhps.table import EmbeddingTable, StageReport, TableSpec
from daskhps.tiers.store import StoreOptions

if TYPE_CHECKING:
    from daskhps.monitor import ShardMetrics

__all__ = ["StageAhead", "WorkerShards", "droppable_commits"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageAhead:
    """One rank's answer to staging a pass ahead, while the current pass holds its pins: the
    report, or why the rows did not fit the device tier beside the pinned ones (an answer,
    not a failure: the pass is staged again once the current one unpins)."""

    report: StageReport | None
    refusal: str | None = None

    @property
    def fitted(self) -> bool:
        return self.report is not None


class WorkerShards:
    """One :class:`EmbeddingTable` per table on one worker, with one lock per table.

    Parameters
    ----------
    tables:
        The tables to hold.
    stores_dir:
        Shard ``r`` of table ``t`` lives at ``<stores_dir>/<t>/rank-<r>``.
    sizing:
        Device and host tier budgets.
    device:
        Device of the device tier (``"cpu"`` or ``"cuda"``).
    policy:
        Eviction policy of the device and host tiers.
    store:
        How each shard's store writes (from ``table.tiers``: its ``snapshot_every``).
    mode, commit:
        Passed to :meth:`EmbeddingTable.open` (``commit``: resume from that commit point).

    The worker's rank and memory limit are bound by :meth:`bind` (the run host does it when
    its plugin is set up on the worker).
    """

    def __init__(
        self,
        tables: Sequence[TableSpec],
        stores_dir: str | Path,
        sizing: TierSizing,
        *,
        device: str = "cpu",
        policy: Literal["lru", "lfu"] = "lru",
        store: StoreOptions | None = None,
        mode: Literal["w", "a", "r"] = "a",
        commit: str | None = None,
    ) -> None:
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ClusterError(f"table names must be unique, got {names}")
        self.specs = {t.name: t for t in tables}
        self.stores_dir = str(stores_dir)
        self.sizing = sizing
        self.device = device
        self.policy = policy
        self.store_options = StoreOptions() if store is None else store
        self.mode = mode
        self.commit_name = commit
        self.rank: int | None = None
        self.memory_limit: int | None = None
        self.tables: dict[str, EmbeddingTable] = {}
        self.locks: dict[str, threading.Lock] = {}
        self.monitor: ShardMetrics | None = None  # dashboard and /metrics figures

    def bind(self, rank: int | None, memory_limit: int | None) -> None:
        """Take the worker's rank (None: not one of the run's ranks) and memory limit."""
        self.rank = rank
        self.memory_limit = memory_limit
        self.locks = {name: threading.Lock() for name in self.specs}
        self.tables = {}

    def store_path(self, table: str) -> Path:
        return Path(self.stores_dir) / table / f"rank-{self._rank()}"

    def open(self) -> dict[str, dict[str, int]]:
        """Open every table's shard; returns each table's tier sizes."""
        budgets = self.sizing.resolve(
            list(self.specs.values()), self.memory_limit, self.device, self.policy
        )
        opened: dict[str, dict[str, int]] = {}
        for name, spec in self.specs.items():
            rows, host_bytes = budgets[name]
            with self.locks[name]:
                if name not in self.tables:
                    self.tables[name] = EmbeddingTable.open(
                        spec,
                        self.store_path(name),
                        device_rows=rows,
                        host_bytes=host_bytes,
                        device=self.device,
                        policy=self.policy,
                        mode=self.mode,
                        commit=self.commit_name,
                        store=self.store_options,
                    )
            opened[name] = {"rank": self._rank(), "device_rows": rows, "host_bytes": host_bytes}
        return opened

    @contextlib.contextmanager
    def locked(self, table: str) -> Iterator[EmbeddingTable]:
        """The table's shard, held under its lock for the ``with`` block."""
        if table not in self.locks:
            raise ClusterError(f"table {table!r} is not one of {sorted(self.specs)}")
        with self.locks[table]:
            t = self.tables.get(table)
            if t is None:
                raise ClusterError(
                    f"table {table!r} is not open on rank {self.rank}: open the shards first"
                )
            yield t

    # -- a pass ----------------------------------------------------------------------------

    def stage(self, table: str, keys: Any) -> StageReport:
        """Pin ``keys`` (a tensor or array of int64 keys, or a frame with a ``key`` column,
        such as a pass's owner partition) in the device tier."""
        with stage_span("stage"), self.locked(table) as t:
            report = t.stage(keys_of(keys))
        if self.monitor is not None:
            self.monitor.note_staged(table, report)
        return report

    def try_stage(self, table: str, keys: Any) -> StageAhead:
        """:meth:`stage` where not fitting is an expected answer (staging ahead)."""
        try:
            return StageAhead(self.stage(table, keys))
        except CapacityError as e:  # an answer, not a failure: Dask would log it as one
            return StageAhead(None, str(e))

    def record_seen(self, table: str, keys: Any) -> None:
        """Count a pass's owner partition (columns ``key``, ``count``, ``day``) in the rows'
        statistics: its keys are pinned, so this moves no row."""
        with stage_span("count"), self.locked(table) as t:
            t.record_seen(
                keys_of(keys),
                column_of(keys, "count", torch.int64),
                column_of(keys, "day", torch.int32),
            )

    def unpin(self, table: str) -> None:
        with self.locked(table) as t:
            t.unpin()
        if self.monitor is not None:
            self.monitor.note_unpinned(table)

    def lookup(self, table: str, keys: torch.Tensor, *, read_only: bool = False) -> torch.Tensor:
        with self.locked(table) as t:
            return t.lookup(keys, read_only=read_only)

    def apply_gradients(self, table: str, keys: torch.Tensor, grads: torch.Tensor) -> None:
        with self.locked(table) as t:
            t.apply_gradients(keys, grads)

    # -- checkpoints -----------------------------------------------------------------------

    def flush(self) -> dict[str, int]:
        out = {}
        for name in self.tables:
            with stage_span("write-back"), self.locked(name) as t:
                out[name] = t.flush()
        return out

    def commit(self, name: str, meta: dict[str, Any] | None = None) -> dict[str, str]:
        out = {}
        for table in self.tables:
            with self.locked(table) as t:
                with stage_span("write-back"):
                    t.flush()
                with stage_span("checkpoint"):  # the flush inside commit finds nothing dirty
                    out[table] = t.commit(name, meta).name
        return out

    def compact(self) -> dict[str, int]:
        """Compact every store (the next commit writes a full index snapshot: a base); bytes
        freed per table."""
        out = {}
        for name in list(self.tables):
            with self.locked(name) as t:
                # Merging small segments too: evictions in the middle of a pass leave many.
                out[name] = t.store.compact(min_stale=0.5, merge_below=4096).bytes_freed
        return out

    def drop_commits_before(self, name: str, prefix: str = "") -> dict[str, int]:
        """Drop the commits older than the newest commit called ``name`` in every store, and
        the files only they used; commits dropped per table. With ``prefix``, only commits
        whose names start with it are dropped (the oldest ones, up to the first that does
        not), so commits other users of the stores made stay. A store without ``name`` is
        left alone."""
        out = {}
        for table in list(self.tables):
            with self.locked(table) as t:
                names = [c.name for c in t.store.commits()]
                if name not in names:
                    out[table] = 0
                    continue
                n = droppable_commits(names, name, prefix)
                out[table] = len(t.store.drop_commits(len(names) - n)) if n else 0
        return out

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.tables:
            with self.locked(name) as t:
                out[name] = t.stats()
                if self.monitor is not None:  # the lock is held anyway: refresh for free
                    self.monitor.update(name, out[name], len(t.store))
        return {"rank": self.rank, "memory_limit": self.memory_limit, "tables": out}

    def close(self, uncommitted: Literal["warn", "drop"] = "warn") -> None:
        """Close every shard (releases the stores' write locks). Safe to call twice.
        ``uncommitted``: see :meth:`EmbeddingTable.close`."""
        for name in list(self.tables):
            lock = self.locks.get(name)
            with lock if lock is not None else contextlib.nullcontext():
                table = self.tables.pop(name, None)
                if table is not None:
                    try:
                        table.close(uncommitted=uncommitted)
                    except Exception as e:  # keep closing the others
                        log.error("closing table %r on rank %s: %s", name, self.rank, e)

    def _rank(self) -> int:
        if self.rank is None:
            raise ClusterError(
                "this worker is not one of the run's ranks; pin shard tasks to the addresses "
                "the run was started with"
            )
        return self.rank


def keys_of(part: Any) -> torch.Tensor:
    """int64 keys of a pass's owner partition (a frame with a ``key`` column) or of an array."""
    if hasattr(part, "columns"):
        return column_of(part, "key", torch.int64)
    return _tensor(part, torch.int64)


def column_of(part: Any, column: str, dtype: torch.dtype) -> torch.Tensor:
    """One column of a pass's owner partition as a tensor of ``dtype``."""
    return _tensor(part[column].to_numpy(), dtype)


def _tensor(raw: Any, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(raw, np.ndarray) and not raw.flags.writeable:
        raw = raw.copy()  # a read-only pandas view: torch must not alias it
    return torch.as_tensor(raw).to(dtype)


def droppable_commits(names: Sequence[str], name: str, prefix: str = "") -> int:
    """How many of a store's oldest commits ``names`` (oldest first) may go so that the newest
    ``name`` and everything after it stay, dropping only names starting with ``prefix``: a
    store drops a prefix of its history, so the first foreign commit ends it."""
    cut = len(names) - 1 - list(names)[::-1].index(name)
    n = 0
    while n < cut and names[n].startswith(prefix):
        n += 1
    return n

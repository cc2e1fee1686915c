"""ShardHost: the worker plugin that holds each worker's shard of every table.

::

    client                              worker r (rank r)
    ------                              -----------------
    register ShardHost(tables, ...) --> setup: rank = addresses.index(worker.address)
    open_shards ---- pinned task -----> EmbeddingTable.open(<stores>/<table>/rank-<r>)
    stage_shards --- pinned task -----> with lock[table]: table.stage(keys of pass k+1)
    training task (another thread) ---> with lock[table]: lookup / apply_gradients
    commit_shards / shard_stats ------> with lock[table]: commit(name) / stats()
    close_shards -------------------> close tables (releases the stores' locks), unregister

Every table call goes through the table's lock, because staging the next pass and training
the current one run in two threads of the same worker. Stores are keyed by rank, so a restart
with the same number of workers finds each shard where it left it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from distributed import WorkerPlugin

from daskhps.distributed._errors import ClusterError
from daskhps.distributed._pinned import run_pinned
from daskhps.distributed.sizing import TierSizing
from daskhps.errors import CapacityError
from daskhps.monitor import ShardMetrics, stage_span
from daskhps.table import EmbeddingTable, StageReport, TableSpec

__all__ = [
    "ShardHost",
    "close_shards",
    "commit_shards",
    "compact_shards",
    "drop_commits_before",
    "droppable_commits",
    "flush_shards",
    "local_shards",
    "open_shards",
    "shard_stats",
    "stage_shards",
    "try_stage_shards",
]

log = logging.getLogger(__name__)

PLUGIN_NAME = "daskhps-shard-host"


class ShardHost(WorkerPlugin):
    """Holds one :class:`EmbeddingTable` per table on each worker, with one lock per table.

    Parameters
    ----------
    tables:
        The tables to hold.
    stores_dir:
        Shard ``r`` of table ``t`` lives at ``<stores_dir>/<t>/rank-<r>``.
    addresses:
        Worker addresses in rank order; a worker outside the list holds nothing.
    sizing:
        Device and host tier budgets.
    device:
        Device of the device tier (``"cpu"`` or ``"cuda"``).
    policy:
        Eviction policy of the device and host tiers.
    snapshot_every:
        Commits between full index snapshots of each store (``table.tiers.snapshot_every``).
    mode, commit:
        Passed to :meth:`EmbeddingTable.open` (``commit``: resume from that commit point).
    """

    name = PLUGIN_NAME
    idempotent = False

    def __init__(
        self,
        tables: Sequence[TableSpec],
        stores_dir: str | Path,
        addresses: Sequence[str],
        sizing: TierSizing,
        *,
        device: str = "cpu",
        policy: Literal["lru", "lfu"] = "lru",
        snapshot_every: int = 8,
        mode: Literal["w", "a", "r"] = "a",
        commit: str | None = None,
    ) -> None:
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ClusterError(f"table names must be unique, got {names}")
        self.specs = {t.name: t for t in tables}
        self.stores_dir = str(stores_dir)
        self.addresses = tuple(addresses)
        self.sizing = sizing
        self.device = device
        self.policy = policy
        self.snapshot_every = snapshot_every
        self.mode = mode
        self.commit_name = commit
        self.rank: int | None = None
        self.memory_limit: int | None = None
        self.tables: dict[str, EmbeddingTable] = {}
        self.locks: dict[str, threading.Lock] = {}
        self.monitor: ShardMetrics | None = None  # dashboard and /metrics figures

    # -- plugin hooks (event loop: keep them light; opening runs in a task) -------------

    def setup(self, worker: Any) -> None:
        addr = worker.address
        self.rank = self.addresses.index(addr) if addr in self.addresses else None
        self.memory_limit = worker.memory_manager.memory_limit or None
        self.locks = {name: threading.Lock() for name in self.specs}
        self.tables = {}
        if self.rank is None:
            log.warning("worker %s is not one of the run's ranks: it holds no shard", addr)
        self.monitor = ShardMetrics(self, str(addr))
        self.monitor.register(worker)

    def teardown(self, worker: Any) -> None:
        if self.monitor is not None:
            self.monitor.unregister(worker)
        self.close()

    # -- worker-side API -----------------------------------------------------------------

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
                        snapshot_every=self.snapshot_every,
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
                    f"table {table!r} is not open on rank {self.rank}: call open_shards first"
                )
            yield t

    def stage(self, table: str, keys: torch.Tensor) -> StageReport:
        with stage_span("stage"), self.locked(table) as t:
            report = t.stage(keys)
        if self.monitor is not None:
            self.monitor.note_staged(table, report)
        return report

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
                "the ShardHost was registered with"
            )
        return self.rank


def local_shards() -> ShardHost:
    """This worker's :class:`ShardHost` (call it inside a Dask task)."""
    from distributed import get_worker

    worker = get_worker()
    host = worker.plugins.get(PLUGIN_NAME)
    if not isinstance(host, ShardHost):
        raise ClusterError(
            f"worker {worker.address} has no ShardHost: call open_shards(client, host) first"
        )
    return host


# -- client side: one pinned task per rank ---------------------------------------------


def _open() -> dict[str, dict[str, int]]:
    return local_shards().open()


def _stage(part: Any, table: str) -> StageReport:
    raw = part["key"].to_numpy() if hasattr(part, "columns") else part
    if isinstance(raw, np.ndarray) and not raw.flags.writeable:
        raw = raw.copy()  # a read-only pandas view: torch must not alias it
    keys = torch.as_tensor(raw)
    return local_shards().stage(table, keys.to(torch.int64))


def _try_stage(part: Any, table: str) -> StageReport | str:
    try:
        return _stage(part, table)
    except CapacityError as e:  # an answer, not a failure: Dask would log it as one
        return str(e)


def _flush() -> dict[str, int]:
    return local_shards().flush()


def _commit(name: str, meta: dict[str, Any] | None) -> dict[str, str]:
    return local_shards().commit(name, meta)


def _stats() -> dict[str, Any]:
    return local_shards().stats()


def _close(uncommitted: Literal["warn", "drop"]) -> None:
    local_shards().close(uncommitted)


def open_shards(client: Any, host: ShardHost) -> list[dict[str, dict[str, int]]]:
    """Register ``host`` on the cluster and open every shard; tier sizes in rank order."""
    client.register_plugin(host, name=PLUGIN_NAME)
    return run_pinned(client, host.addresses, _open, what="open shards")


def stage_shards(
    client: Any, addresses: Sequence[str], table: str, parts: Sequence[Any]
) -> list[StageReport]:
    """Stage ``parts[r]`` (keys, or a frame with a ``key`` column, or a future of one already
    on worker ``r`` such as an ``OwnerPlacement``'s) into rank ``r``'s shard."""
    return run_pinned(
        client, addresses, _stage, table, rank_args=[(p,) for p in parts], what="stage shards"
    )


def try_stage_shards(
    client: Any, addresses: Sequence[str], table: str, parts: Sequence[Any]
) -> list[StageReport] | str:
    """:func:`stage_shards` where not fitting is an expected answer (staging the next pass
    while the current one holds its pins): the reports, or the first rank's refusal message.
    Every rank finishes its attempt before this returns."""
    out = run_pinned(
        client, addresses, _try_stage, table, rank_args=[(p,) for p in parts], what="stage ahead"
    )
    refusals = [r for r in out if isinstance(r, str)]
    return refusals[0] if refusals else out


def flush_shards(client: Any, addresses: Sequence[str]) -> list[dict[str, int]]:
    return run_pinned(client, addresses, _flush, what="flush shards")


def commit_shards(
    client: Any, addresses: Sequence[str], name: str, meta: dict[str, Any] | None = None
) -> list[dict[str, str]]:
    return run_pinned(client, addresses, _commit, name, meta, what="commit shards")


def shard_stats(client: Any, addresses: Sequence[str]) -> list[dict[str, Any]]:
    return run_pinned(client, addresses, _stats, what="shard stats")


def _compact() -> dict[str, int]:
    host = local_shards()
    out = {}
    for name in list(host.tables):
        with host.locked(name) as t:
            # Merging small segments too: evictions in the middle of a pass leave many.
            out[name] = t.store.compact(min_stale=0.5, merge_below=4096).bytes_freed
    return out


def compact_shards(client: Any, addresses: Sequence[str]) -> list[dict[str, int]]:
    """Compact every shard store (the next commit writes a full index snapshot: a base);
    bytes freed per table, in rank order."""
    return run_pinned(client, addresses, _compact, what="compact shards")


def _drop_before(name: str, prefix: str) -> dict[str, int]:
    host = local_shards()
    out = {}
    for table in list(host.tables):
        with host.locked(table) as t:
            names = [c.name for c in t.store.commits()]
            if name not in names:
                out[table] = 0
                continue
            n = droppable_commits(names, name, prefix)
            out[table] = len(t.store.drop_commits(len(names) - n)) if n else 0
    return out


def droppable_commits(names: Sequence[str], name: str, prefix: str = "") -> int:
    """How many of a store's oldest commits ``names`` (oldest first) may go so that the newest
    ``name`` and everything after it stay, dropping only names starting with ``prefix``: a
    store drops a prefix of its history, so the first foreign commit ends it."""
    cut = len(names) - 1 - list(names)[::-1].index(name)
    n = 0
    while n < cut and names[n].startswith(prefix):
        n += 1
    return n


def drop_commits_before(
    client: Any, addresses: Sequence[str], name: str, prefix: str = ""
) -> list[dict[str, int]]:
    """Drop the commits older than the newest commit called ``name`` in every shard store,
    and the files only they used; commits dropped per table, in rank order. With ``prefix``,
    only commits whose names start with it are dropped (the oldest ones, up to the first
    that does not), so commits other users of the stores made stay. A store without ``name``
    is left alone."""
    return run_pinned(client, addresses, _drop_before, name, prefix, what="drop old commits")


def close_shards(
    client: Any, addresses: Sequence[str], uncommitted: Literal["warn", "drop"] = "warn"
) -> None:
    """Close every shard, then unregister the plugin (its teardown is then a no-op).
    ``uncommitted="drop"``: rows changed since the last commit go without a warning (a run
    that stopped, to resume from its last checkpoint)."""
    try:
        run_pinned(client, addresses, _close, uncommitted, what="close shards")
    finally:
        with contextlib.suppress(Exception):  # teardown closes whatever is still open
            client.unregister_worker_plugin(PLUGIN_NAME)

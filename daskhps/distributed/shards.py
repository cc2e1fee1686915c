"""WorkerShards: one worker's shard of every table of a run, each behind its own lock.

::

    RunHost (worker plugin, one per run)
      └─ WorkerShards
           tables[t]  EmbeddingTable.open(<stores_dir>/<t>/rank-<r>)   device -> host -> store
           locks[t]   held by every call below: staging the next pass (one worker thread)
                      and training the current one (another) share the table

    open ─► stage / try_stage (pin a pass's keys) ─► admit (which new keys get rows)
        ─► lookup / apply_gradients (a pass trains) ─► record_seen (count it)
        ─► expire (at a day boundary) ─► unpin   (the three in one call: pass_end.end_pass)
        ─► flush / commit / compact / drop_commits_before (checkpoints) ─► close

    lifecycle   the tables' admission and expiry rules, and the counts of the keys admission
                holds back (daskhps.distributed.key_lifecycle)

The client calls every verb on all ranks at once through
:meth:`daskhps.distributed.RunGroup.on_shards` (``group.on_shards(WorkerShards.commit, name)``):
there is no per-verb task function or client wrapper. Stores are keyed by rank, so a restart
with the same number of workers finds each shard where it left it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch

from daskhps.data.keyspace import TABLE_SHIFT
from daskhps.distributed._errors import ClusterError, required_rank
from daskhps.distributed.key_lifecycle import KeyLifecycle
from daskhps.distributed.partition_columns import keys_of
from daskhps.errors import CapacityError
from daskhps.stages import stage_span
from daskhps.table import EmbeddingTable, StageReport, TableSpec
from daskhps.table.admission import AdmissionRule
from daskhps.table.expiry import ExpiryRule
from daskhps.tier_sizing import TierSizing
from daskhps.tiers.store import StoreOptions

if TYPE_CHECKING:
    from daskhps.monitor import ShardMetrics

__all__ = ["StageAhead", "WorkerShards", "droppable_commits"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass(frozen=True)
class StageAhead:
    """One rank's answer to staging a pass ahead, while the current pass holds its pins: the
    report, or why the rows did not fit the device tier beside the pinned ones (an answer,
    not a failure: the pass is staged again once the current one unpins). With several
    tables, those that fitted are staged even when another did not: ``report`` then tells
    what they fetched."""

    report: StageReport | None
    refusal: str | None = None

    @property
    def fitted(self) -> bool:
        return self.refusal is None


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
    admission:
        When a key gets a row (None: at once, in the first pass that holds it); one rule for
        every table, or a rule per table name.
    expiry:
        When rows leave the table (:meth:`expire`; None: never); one or per table.
    tagged:
        Keys carry their table's index (``key >> TABLE_SHIFT``, :mod:`daskhps.data.keyspace`):
        the index of ``tables``. Then the verbs that take a table also take None, for every
        table, each key going to the table its index names.

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
        admission: AdmissionRule | Mapping[str, AdmissionRule] | None = None,
        expiry: ExpiryRule | Mapping[str, ExpiryRule] | None = None,
        tagged: bool = False,
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
        self.tagged = tagged
        self.order = names
        self.lifecycle = KeyLifecycle(names, admission, expiry)
        self.monitor: ShardMetrics | None = None  # dashboard and /metrics figures
        # Tables sharing a fractional budget open with the same rows each; the first pass
        # staged on every table at once resizes them by its keys (see split_by_keys)
        self._splits_by_keys = tagged and sizing.splits(tables)
        self._sized_by_keys = not self._splits_by_keys

    def bind(self, rank: int | None, memory_limit: int | None) -> None:
        """Take the worker's rank (None: not one of the run's ranks) and memory limit."""
        self.rank = rank
        self.memory_limit = memory_limit
        self.locks = {name: threading.Lock() for name in self.specs}
        self.tables = {}
        self.lifecycle.bind(rank)
        self._sized_by_keys = not self._splits_by_keys

    def store_path(self, table: str) -> Path:
        return Path(self.stores_dir) / table / f"rank-{required_rank(self.rank)}"

    def open(self) -> dict[str, dict[str, int]]:
        """Open every table's shard; returns each table's tier sizes."""
        budgets = self.sizing.resolve(
            list(self.specs.values()), self.memory_limit, self.device, self.policy
        )
        policies = {name: b.policy for name, b in self.sizing.own if b.policy is not None}
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
                        policy=policies.get(name, self.policy),  # type: ignore[arg-type]
                        mode=self.mode,
                        commit=self.commit_name,
                        store=self.store_options,
                    )
                    self.lifecycle.load(name, self.tables[name])
            opened[name] = {
                "rank": required_rank(self.rank),
                "device_rows": rows,
                "host_bytes": host_bytes,
            }
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

    def split(self, keys: Any, table: str | None = None) -> list[tuple[str, Any]]:
        """``keys`` (int64 keys, or a frame with a ``key`` column) by table: ``(name, its
        keys)`` for every table, in order. Keys carry their table's index when ``tagged``;
        otherwise the shards hold one table and it gets them all, as ``table`` does when
        given."""
        if table is not None:
            return [(table, keys)]
        if not self.tagged:
            if len(self.order) != 1:
                raise ClusterError(
                    f"the shards hold tables {self.order} with untagged keys: name the table"
                )
            return [(self.order[0], keys)]
        index = keys_of(keys) >> TABLE_SHIFT
        out = []
        for i, name in enumerate(self.order):
            mask = index == i
            out.append((name, keys[mask] if isinstance(keys, torch.Tensor) else keys[mask.numpy()]))
        return out

    def _each(
        self,
        span: str,
        parts: Sequence[tuple[str, Any]],
        verb: Callable[[str, EmbeddingTable, Any, ShardMetrics | None], _T],
    ) -> list[_T]:
        """``verb(name, its shard, part, monitor)`` for every ``(name, part)`` of ``parts``,
        holding the table's lock, timed as stage ``span``."""
        out = []
        for name, part in parts:
            with stage_span(span), self.locked(name) as t:
                out.append(verb(name, t, part, self.monitor))
        return out

    def stage(self, table: str | None, keys: Any) -> StageReport:
        """Pin ``keys`` (a tensor or array of int64 keys, or a frame with a ``key`` column,
        such as a pass's owner partition) in the device tier (``table`` None: every table's
        share, see :meth:`split`, the first such pass sizing the tables' shared budgets)."""
        if table is None:
            self.split_by_keys(keys)
        return _summed(self._each("stage", self.split(keys, table), self._stage))

    def split_by_keys(self, keys: Any) -> dict[str, tuple[int, int]] | None:
        """Resize the tiers of tables that share a fractional budget by each one's count of
        ``keys`` (tagged; a pass's owner partition), once, before any row is staged
        (:func:`daskhps.tier_sizing.shares`): a table with most of the pass's keys gets most
        of the rows. Returns the new ``{table: (device_rows, host_bytes)}``, or None when
        there is nothing to resize (one table, own budgets, done already, or rows held)."""
        if self._sized_by_keys:
            return None
        self._sized_by_keys = True
        for name in self.order:
            with self.locked(name) as t:
                if t.cached_rows():
                    log.info("rank %s: tiers hold rows, not resized by keys", self.rank)
                    return None
        index = keys_of(keys) >> TABLE_SHIFT
        counts = torch.bincount(index, minlength=len(self.order)).tolist()
        budgets = self.sizing.resolve(
            list(self.specs.values()),
            self.memory_limit,
            self.device,
            self.policy,
            keys=dict(zip(self.order, counts, strict=False)),
        )
        for name in self.order:
            with self.locked(name) as t:
                t.resize_caches(*budgets[name])
        log.info(
            "rank %s: tiers split by the first pass's keys: %s",
            self.rank,
            ", ".join(
                f"{n} {c} keys -> {budgets[n][0]} device rows, {budgets[n][1] >> 20} MiB host"
                for n, c in zip(self.order, counts, strict=False)
            ),
        )
        return budgets

    def _stage(
        self, table: str, t: EmbeddingTable, keys: Any, monitor: ShardMetrics | None
    ) -> StageReport:
        try:
            report = t.stage(keys_of(keys))
        except CapacityError as e:
            if len(self.order) == 1:
                raise
            # The run's budget is split between the tables by the first pass's keys, which
            # a later pass may divide otherwise: say which lever moves one table's.
            raise CapacityError(
                f"table {table!r}: {e}; the tables share table.tiers' budgets as the "
                "first pass's keys divide between them: give this table budgets of its "
                "own (its entry's tiers.device in tables:, listing its fields there if it "
                "is the default table) or raise table.tiers.device"
            ) from e
        if monitor is not None:
            monitor.note_staged(table, report)
        return report

    def try_stage(self, table: str | None, keys: Any) -> StageAhead:
        """:meth:`stage` where not fitting is an expected answer (staging ahead)."""
        reports, refusal = [], None
        if table is None:
            self.split_by_keys(keys)
        for name, part in self.split(keys, table):
            try:
                reports.append(self.stage(name, part))
            except CapacityError as e:  # an answer, not a failure: Dask would log it as one
                refusal = refusal or str(e)
        return StageAhead(_summed(reports) if reports else None, refusal)

    def admit(self, table: str | None, keys: Any) -> dict[str, int]:
        """Decide which keys of a staged pass's owner partition (columns ``key``, ``count``)
        without a row this pass admits; the others are frozen (no update) until the pass is
        counted. Returns how many were admitted and how many held back. Without an
        admission rule every key is admitted and nothing is done."""
        return _added(self._each("admit", self.split(keys, table), self.lifecycle.admit))

    def record_seen(self, table: str | None, keys: Any) -> None:
        """Count a pass's owner partition (columns ``key``, ``count``, ``day``) once it
        trained: the keys with rows in the rows' statistics (its keys are pinned, so this
        moves no row), those held back by admission in the pending counts. A key admitted
        in this pass takes its pending count into its row."""
        self._each("count", self.split(keys, table), self.lifecycle.record_seen)

    def expire(self, table: str | None, today: int) -> dict[str, int]:
        """The day boundary of log day ``today`` (a ``last_day`` number; the pass that ends it
        is counted): remove the rows the expiry rule expires from every tier, and drop the
        pending counts of keys not seen for ``ttl_days``. Returns how many of each (``table``
        None: of every table, summed)."""
        days = [(name, today) for name in (self.order if table is None else [table])]
        return _added(self._each("expire", days, self.lifecycle.expire))

    def unpin(self, table: str | None) -> None:
        for name in self.order if table is None else [table]:
            with self.locked(name) as t:
                t.unpin()
            if self.monitor is not None:
                self.monitor.note_unpinned(name)

    def lookup(self, table: str, keys: torch.Tensor, *, read_only: bool = False) -> torch.Tensor:
        with self.locked(table) as t:
            return t.lookup(keys, read_only=read_only)

    def apply_gradients(self, table: str, keys: torch.Tensor, grads: torch.Tensor) -> None:
        with self.locked(table) as t:
            t.apply_gradients(keys, grads)

    def lookup_tagged(
        self, keys: torch.Tensor, width: int, *, read_only: bool = False
    ) -> torch.Tensor:
        """Rows of keys of every table (``tagged``), ``float[len(keys), width]`` with zeros
        beyond each table's row width; ``width`` is the widest table's."""
        out = torch.zeros((len(keys), width), dtype=torch.float32, device=keys.device)
        index = keys >> TABLE_SHIFT
        for i, name in enumerate(self.order):
            where = (index == i).nonzero().squeeze(1)
            if len(where):
                rows = self.lookup(name, keys[where], read_only=read_only)
                out[where, : rows.shape[1]] = rows.to(out.device)
        return out

    def apply_tagged(self, keys: torch.Tensor, grads: torch.Tensor) -> None:
        """:meth:`apply_gradients` of keys of every table; ``grads`` as
        :meth:`lookup_tagged`'s rows (columns beyond a table's width are ignored)."""
        index = keys >> TABLE_SHIFT
        for i, name in enumerate(self.order):
            where = (index == i).nonzero().squeeze(1)
            if len(where):
                dim = self.specs[name].dim
                self.apply_gradients(name, keys[where], grads[where, :dim])

    # -- checkpoints -----------------------------------------------------------------------

    def flush(self) -> dict[str, int]:
        out = {}
        for name in self.tables:
            with stage_span("write-back"), self.locked(name) as t:
                out[name] = t.flush()
        return out

    def commit(self, name: str, meta: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        """Commit every table's store as ``name``; per table, what identifies that commit
        (``name``, ``seq``, ``time``, ``rows``): a checkpoint records it, so a commit of the
        same name written later (by another run sharing the stores) is told apart."""
        out = {}
        for table in self.tables:
            with self.locked(table) as t:
                with stage_span("write-back"):
                    t.flush()
                attach = self.lifecycle.attachment(table, t)
                with stage_span("checkpoint"):  # the flush inside commit finds nothing dirty
                    info = t.commit(name, meta, attach)
                out[table] = {
                    "name": info.name,
                    "seq": info.seq,
                    "time": info.time,
                    "rows": info.rows,
                }
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
                out[name]["pending"] = self.lifecycle.figures(name)
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


def _summed(reports: list[StageReport]) -> StageReport:
    if len(reports) == 1:
        return reports[0]
    return type(reports[0])(
        **{f.name: sum(getattr(r, f.name) for r in reports) for f in fields(reports[0])}
    )


def _added(counts: list[dict[str, int]]) -> dict[str, int]:
    return {k: sum(c[k] for c in counts) for k in counts[0]}


def droppable_commits(names: Sequence[str], name: str, prefix: str = "") -> int:
    """How many of a store's oldest commits ``names`` (oldest first) may go so that the newest
    ``name`` and everything after it stay, dropping only names starting with ``prefix``: a
    store drops a prefix of its history, so the first foreign commit ends it."""
    cut = len(names) - 1 - list(names)[::-1].index(name)
    n = 0
    while n < cut and names[n].startswith(prefix):
        n += 1
    return n

"""Figures of one worker's shards for the dashboard's Workers table and for ``/metrics``.

::

    RunHost (worker plugin) holding WorkerShards
      setup ──► ShardMetrics(shards).register(worker)
                  worker.metrics["daskhps_<table>_<figure>"] = callback   (Workers table)
                  the process's prometheus collector lists this worker    (/metrics)
      stage ──► note_staged(table, report)     unpin ──► note_unpinned(table)
      admit ──► note_admitted(table, n)        count ──► note_pending(table, n)
      expire ──► note_expired(table, n, pending)
      stats ──► update(table, stats, store_rows)    (full stats, under the lock it holds)
      a pass's record ──► note_network(figures)   (the driver, announce_network: this rank's
                                                   bytes to and from the others, by kind)
      teardown ──► unregister(worker)

Callbacks run on the worker's event loop at every heartbeat, so they read a snapshot, and
the snapshot never costs a pass over the tiers' tensors: hit rates and pinned rows come from
the staging reports; rows and bytes per tier from O(1) sizes, read every ``refresh_s`` for
each table whose lock is free at that moment (``acquire(blocking=False)``: a table busy
staging or training keeps its last figures, the event loop never waits); the store's
counters and size on disk (a walk of its folder) every ``store_refresh_s``, and whenever
``WorkerShards.stats`` runs (the trainer calls it after every pass). ``TierStats`` of the
device cache are not read here: counting dirty and pinned rows sums masks the size of the
tier (about 45 ms per million rows on a 2-core VM). :mod:`daskhps.monitor.prometheus` lists
the registered workers' figures on ``/metrics``.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from daskhps.monitor.prometheus import collector

__all__ = [
    "NETWORK_FIGURES",
    "TIERS",
    "ShardMetrics",
    "TableFigures",
    "announce_network",
    "announce_pass",
    "metric_name",
]

TIERS = ("device", "host", "store", "init")  # where a staged row came from
PREFIX = "daskhps"


@dataclass
class TableFigures:
    """The latest figures of one table's shard on one worker."""

    rows_from: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    rows: dict[str, int] = field(default_factory=lambda: {"device": 0, "host": 0, "store": 0})
    bytes: dict[str, int] = field(default_factory=lambda: {"device": 0, "host": 0, "store": 0})
    store_read_per_s: float = 0.0
    store_written_per_s: float = 0.0
    pinned_rows: int = 0
    rows_staged: int = 0  # cumulative, every stage() call
    rows_admitted: int = 0  # cumulative: keys admission gave a row (table.admission)
    rows_expired: int = 0  # cumulative: rows expiry removed (table.expiry)
    pending_keys: int = 0  # keys seen and not admitted yet, now

    @property
    def hit_rate(self) -> dict[str, float]:
        """Fraction of the rows staged so far found in each tier (``init``: in none)."""
        total = sum(self.rows_from.values())
        return {t: (n / total if total else 0.0) for t, n in self.rows_from.items()}

    def flat(self) -> dict[str, float]:
        """``{figure: value}``, one scalar per Workers-table column."""
        out: dict[str, float] = {}
        for tier, v in self.hit_rate.items():
            out[f"hit_rate_{tier}"] = round(v, 4)
        for tier, n in self.rows.items():
            out[f"rows_{tier}"] = n
        for tier, n in self.bytes.items():
            out[f"bytes_{tier}"] = n
        out["store_rows_read_per_s"] = round(self.store_read_per_s, 1)
        out["store_rows_written_per_s"] = round(self.store_written_per_s, 1)
        out["rows_staged"] = self.rows_staged
        out["pinned_rows"] = self.pinned_rows
        out["rows_admitted"] = self.rows_admitted
        out["rows_expired"] = self.rows_expired
        out["pending_keys"] = self.pending_keys
        return out


def metric_name(table: str, figure: str) -> str:
    """The Workers-table column of ``figure`` of ``table`` (letters, digits, ``_`` only)."""
    return re.sub(r"\W", "_", f"{PREFIX}_{table}_{figure}")


FIGURES = tuple(TableFigures().flat())
# A rank's network figures of the last pass, by kind (daskhps.monitor.network)
NETWORK_FIGURES = ("sent", "received", "min_sent", "min_received")


class ShardMetrics:
    """Snapshot of a :class:`~daskhps.distributed.WorkerShards`' tables, cheap to read.

    Parameters
    ----------
    host:
        Anything with ``tables`` (name -> EmbeddingTable, filled when shards open), ``locks``
        (name -> threading.Lock) and ``specs`` (by table name) attributes.
    address:
        The worker's address; the label of every Prometheus series.
    refresh_s:
        Shortest time between two reads of the tiers' sizes.
    store_refresh_s:
        Shortest time between two reads of the stores' counters and size on disk.
    rate_window_s:
        The store's rows read and written per second are averaged over about this long.
    """

    def __init__(
        self,
        host: Any,
        address: str,
        refresh_s: float = 2.0,
        store_refresh_s: float = 10.0,
        rate_window_s: float = 30.0,
    ) -> None:
        self.host = host
        self.address = address
        self.refresh_s = refresh_s
        self.store_refresh_s = store_refresh_s
        self.rate_window_s = rate_window_s
        self.current_pass = -1  # -1: no pass has started
        # the last pass's bytes to and from the other ranks, by kind then NETWORK_FIGURES,
        # and the sent and received bytes of every pass so far, by kind
        self.network: dict[str, dict[str, int]] = {}
        self.network_total: dict[str, dict[str, int]] = {}
        self._figures = {name: TableFigures() for name in host.specs}
        # (time, store rows read, store rows written) per table, the last rate_window_s
        self._samples: dict[str, deque[tuple[float, int, int]]] = {n: deque() for n in host.specs}
        self._lock = threading.Lock()  # guards the figures; never held while reading a table
        self._refreshed = self._store_refreshed = 0.0
        self._names: list[str] = []

    # -- updates -----------------------------------------------------------------------

    def note_staged(self, table: str, report: Any) -> None:
        """Count a :class:`~daskhps.table.StageReport`."""
        with self._lock:
            f = self._figures[table]
            f.rows_staged += int(report.rows)
            f.pinned_rows = int(report.pinned)
            got = (report.from_device, report.from_host, report.from_store, report.initialised)
            for tier, n in zip(TIERS, got, strict=True):
                f.rows_from[tier] += int(n)

    def note_unpinned(self, table: str) -> None:
        with self._lock:
            self._figures[table].pinned_rows = 0

    def note_admitted(self, table: str, admitted: int) -> None:
        """Count the keys a pass admitted."""
        with self._lock:
            self._figures[table].rows_admitted += int(admitted)

    def note_pending(self, table: str, pending: int) -> None:
        """The keys waiting for admission now (a pass was counted)."""
        with self._lock:
            self._figures[table].pending_keys = int(pending)

    def note_expired(self, table: str, expired: int, pending: int) -> None:
        """Count the rows a day boundary removed; ``pending``: keys waiting after it."""
        with self._lock:
            f = self._figures[table]
            f.rows_expired += int(expired)
            f.pending_keys = int(pending)

    def note_network(self, figures: dict[str, dict[str, int]]) -> None:
        """This rank's network figures of a pass (``{kind: {figure: bytes}}``, figures of
        :data:`NETWORK_FIGURES`): the last pass's, and added to the totals."""
        with self._lock:
            self.network = {k: dict(v) for k, v in figures.items()}
            for kind, f in figures.items():
                total = self.network_total.setdefault(kind, {"sent": 0, "received": 0})
                total["sent"] += int(f.get("sent", 0))
                total["received"] += int(f.get("received", 0))

    def network_figures(self) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
        """Copies of the last pass's network figures and of the totals, by kind."""
        with self._lock:
            return (
                {k: dict(v) for k, v in self.network.items()},
                {k: dict(v) for k, v in self.network_total.items()},
            )

    def network_flat(self) -> dict[str, int]:
        """The last pass's figures summed over kinds (the Workers-table columns)."""
        with self._lock:
            return {
                f: sum(int(v.get(f, 0)) for v in self.network.values()) for f in NETWORK_FIGURES
            }

    def update(self, table: str, stats: dict[str, Any], store_rows: int) -> None:
        """Take ``EmbeddingTable.stats()`` of ``table`` (read by a caller holding its lock)."""
        sizes = {
            t: (int(s.get("rows", 0)), int(s.get("bytes", 0)))
            for t in ("device", "host")
            for s in [stats.get(t, {})]
        }
        store = stats.get("store", {})
        if "pending" in stats:
            with self._lock:
                self._figures[table].pending_keys = int(stats["pending"]["keys"])
        self._put(table, sizes, store_rows, store)

    def _put(
        self,
        table: str,
        sizes: dict[str, tuple[int, int]],
        store_rows: int,
        store: dict[str, Any] | None,
    ) -> None:
        now = time.monotonic()
        with self._lock:
            f = self._figures[table]
            for tier, (rows, nbytes) in sizes.items():
                f.rows[tier], f.bytes[tier] = rows, nbytes
            f.rows["store"] = int(store_rows)
            if store is None:
                return
            f.bytes["store"] = int(store.get("bytes_on_disk", 0))
            read, written = int(store.get("rows_read", 0)), int(store.get("rows_written", 0))
            samples = self._samples[table]
            samples.append((now, read, written))
            while len(samples) > 2 and samples[1][0] <= now - self.rate_window_s:
                samples.popleft()  # keep one sample at least a window old
            t0, r0, w0 = samples[0]
            dt = now - t0
            f.store_read_per_s = max(read - r0, 0) / dt if dt > 0 else 0.0
            f.store_written_per_s = max(written - w0, 0) / dt if dt > 0 else 0.0

    def refresh(self, force: bool = False) -> None:
        """Re-read every table whose lock is free now, at most every ``refresh_s`` (the
        store's counters at most every ``store_refresh_s``)."""
        now = time.monotonic()
        if not force and now - self._refreshed < self.refresh_s:
            return
        self._refreshed = now
        with_store = force or now - self._store_refreshed >= self.store_refresh_s
        if with_store:
            self._store_refreshed = now
        for name, lock in list(self.host.locks.items()):
            if not lock.acquire(blocking=False):
                continue  # staging or training holds it: keep the last figures
            try:
                t = self.host.tables.get(name)
                if t is None:
                    continue
                sizes = {"device": (len(t.device_cache), t.device_cache.nbytes)}
                sizes["host"] = (len(t.host), t.host.nbytes) if t.host is not None else (0, 0)
                store_rows = len(t.store)
                store = t.store.stats.as_dict() if with_store else None
            finally:
                lock.release()
            self._put(name, sizes, store_rows, store)

    # -- reading -----------------------------------------------------------------------

    def figures(self) -> dict[str, TableFigures]:
        """A copy of the latest figures, by table (refreshing first if due)."""
        self.refresh()
        with self._lock:
            return {k: TableFigures(**_copied(v)) for k, v in self._figures.items()}

    def value(self, table: str, figure: str) -> float:
        """One figure of one table (refreshing first if due)."""
        self.refresh()
        with self._lock:
            return self._figures[table].flat()[figure]

    # -- registration ------------------------------------------------------------------

    def register(self, worker: Any) -> None:
        """Add the Workers-table callbacks to ``worker.metrics`` and list this worker on the
        process's ``/metrics``."""
        metrics = getattr(worker, "metrics", None)
        if isinstance(metrics, dict):
            self._names = []
            for table in self._figures:
                for figure in FIGURES:
                    name = metric_name(table, figure)
                    metrics[name] = _Callback(self, table, figure)
                    self._names.append(name)
            metrics[f"{PREFIX}_pass"] = _PassCallback(self)
            self._names.append(f"{PREFIX}_pass")
            for figure in NETWORK_FIGURES:
                name = f"{PREFIX}_network_{figure}_bytes"
                metrics[name] = _NetworkCallback(self, figure)
                self._names.append(name)
        collector().add(self)

    def unregister(self, worker: Any) -> None:
        metrics = getattr(worker, "metrics", None)
        if isinstance(metrics, dict):
            for name in self._names:
                if isinstance(metrics.get(name), _Callback | _PassCallback | _NetworkCallback):
                    metrics.pop(name, None)
        self._names = []
        collector().remove(self)


def _copied(f: TableFigures) -> dict[str, Any]:
    return {k: dict(v) if isinstance(v, dict) else v for k, v in vars(f).items()}


class _Callback:
    """``worker.metrics`` entry: ``callback(worker) -> value`` of one figure."""

    def __init__(self, metrics: ShardMetrics, table: str, figure: str) -> None:
        self.metrics, self.table, self.figure = metrics, table, figure

    def __call__(self, worker: Any = None) -> float:
        return self.metrics.value(self.table, self.figure)


class _PassCallback:
    def __init__(self, metrics: ShardMetrics) -> None:
        self.metrics = metrics

    def __call__(self, worker: Any = None) -> int:
        return self.metrics.current_pass


class _NetworkCallback:
    """``worker.metrics`` entry: one network figure of the last pass, over every kind."""

    def __init__(self, metrics: ShardMetrics, figure: str) -> None:
        self.metrics, self.figure = metrics, figure

    def __call__(self, worker: Any = None) -> int:
        return self.metrics.network_flat()[self.figure]


# -- the current pass ------------------------------------------------------------------


def _set_pass(index: int, dask_worker: Any = None) -> bool:
    m = collector().get(str(dask_worker.address))
    if m is not None:
        m.current_pass = int(index)
    return m is not None


def announce_pass(client: Any, addresses: list[str], index: int) -> None:
    """Tell every worker in ``addresses`` that pass ``index`` is training (the ``pass``
    column). Runs on the workers' event loops, not in a task thread."""
    client.run(_set_pass, index, workers=list(addresses), on_error="ignore")


def _set_network(by_address: dict[str, dict[str, dict[str, int]]], dask_worker: Any = None) -> bool:
    address = str(dask_worker.address)
    m = collector().get(address)
    if m is not None and address in by_address:
        m.note_network(by_address[address])
    return m is not None


def announce_network(client: Any, addresses: list[str], record: dict[str, Any]) -> None:
    """Give rank ``r`` (worker ``addresses[r]``) its figures of a pass's ``network`` record
    (:func:`daskhps.monitor.network.network_record`), for the dashboard and ``/metrics``."""
    by_address: dict[str, dict[str, dict[str, int]]] = {}
    for r, address in enumerate(addresses):
        by_address[address] = {
            kind: {f: int(v[f"rank_{f}"][r]) for f in NETWORK_FIGURES}
            for kind, v in record.items()
            if isinstance(v, dict) and kind != "total" and "rank_sent" in v
        }
    client.run(_set_network, by_address, workers=list(addresses), on_error="ignore")

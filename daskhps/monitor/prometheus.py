"""The process's ``/metrics``: every registered worker's
:class:`~daskhps.monitor.worker_metrics.ShardMetrics` as Prometheus families (a ``worker`` label
on each series), and the registry of those workers by address.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from daskhps.stages import stage_seconds

if TYPE_CHECKING:
    from daskhps.monitor.worker_metrics import ShardMetrics

__all__ = ["collector"]


class _Collector:
    """One prometheus collector per process, listing every registered worker's figures.

    One per process, not per worker: with ``processes=False`` several workers share the
    process's registry, and registering a second collector with the same metric names fails.
    Each series carries a ``worker`` label instead.
    """

    def __init__(self) -> None:
        self._hosts: dict[str, ShardMetrics] = {}
        self._lock = threading.Lock()

    def add(self, m: ShardMetrics) -> None:
        with self._lock:
            self._hosts[m.address] = m  # a plugin registered again replaces the old one

    def remove(self, m: ShardMetrics) -> None:
        with self._lock:
            if self._hosts.get(m.address) is m:
                del self._hosts[m.address]

    def get(self, address: str) -> ShardMetrics | None:
        with self._lock:
            return self._hosts.get(address)

    def collect(self) -> Iterator[Any]:
        with self._lock:
            hosts = list(self._hosts.values())
        families = _new_families()
        for m in hosts:
            _add_worker(families, m)
        yield from families.values()


@dataclass(frozen=True)
class _Family:
    """One metric family of ``/metrics``: a gauge, or a counter (``_total`` appended)."""

    name: str
    help: str
    labels: tuple[str, ...]
    counter: bool = False


_WKD = ("worker", "kind", "direction")
_WTT = ("worker", "table", "tier")
_WT = ("worker", "table")
# In the order /metrics lists them: the gauges, then the counters.
_FAMILIES: dict[str, _Family] = {
    "hit_rate": _Family(
        "daskhps_hit_rate", "Fraction of the rows staged so far that were found in each tier", _WTT
    ),
    "rows": _Family("daskhps_rows", "Rows held in each tier", _WTT),
    "bytes": _Family("daskhps_bytes", "Bytes held by each tier (the store: on disk)", _WTT),
    "read": _Family(
        "daskhps_store_rows_read_per_second",
        "Rows read from the zarr store per second, over the last 30 s or so",
        _WT,
    ),
    "written": _Family(
        "daskhps_store_rows_written_per_second",
        "Rows written to the zarr store per second, over the last 30 s or so",
        _WT,
    ),
    "pinned": _Family(
        "daskhps_pinned_rows", "Rows pinned in the device tier (staged working sets)", _WT
    ),
    "pass": _Family("daskhps_pass", "Index of the pass training now (-1: none yet)", ("worker",)),
    "pending": _Family(
        "daskhps_pending_keys", "Keys seen and not admitted yet (table.admission)", _WT
    ),
    "net_pass": _Family(
        "daskhps_network_pass_bytes",
        "Bytes this rank sent to (direction=sent) or received from the other ranks in the "
        "last pass, by what they carry",
        _WKD,
    ),
    "net_min": _Family(
        "daskhps_network_pass_minimum_bytes",
        "The least the last pass needed this rank to send or receive, by what it carries",
        _WKD,
    ),
    "staged": _Family("daskhps_rows_staged", "Rows staged into the device tier", _WT, counter=True),
    "admitted": _Family(
        "daskhps_rows_admitted", "Keys admission gave a row (table.admission)", _WT, counter=True
    ),
    "expired": _Family(
        "daskhps_rows_expired",
        "Rows expiry removed at day boundaries (table.expiry)",
        _WT,
        counter=True,
    ),
    "rows_from": _Family(
        "daskhps_rows_from",
        "Rows staged, by the tier they were found in (init: none)",
        _WTT,
        counter=True,
    ),
    "seconds": _Family(
        "daskhps_stage_seconds", "Seconds spent in each stage", ("worker", "stage"), counter=True
    ),
    "net_total": _Family(
        "daskhps_network_bytes",
        "Bytes this rank sent to or received from the other ranks in the passes so far, by "
        "what they carry",
        _WKD,
        counter=True,
    ),
}


def _new_families() -> dict[str, Any]:
    """Empty prometheus families of :data:`_FAMILIES`, by the same keys and in their order."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    return {
        key: (CounterMetricFamily if f.counter else GaugeMetricFamily)(
            f.name, f.help, labels=list(f.labels)
        )
        for key, f in _FAMILIES.items()
    }


def _add_worker(families: dict[str, Any], m: ShardMetrics) -> None:
    """One worker's samples: its pass, each table's figures and its stages' seconds."""
    w = m.address
    families["pass"].add_metric([w], m.current_pass)
    for table, f in m.figures().items():
        for tier in f.rows_from:
            families["hit_rate"].add_metric([w, table, tier], f.hit_rate[tier])
            families["rows_from"].add_metric([w, table, tier], f.rows_from[tier])
        for tier in f.rows:
            families["rows"].add_metric([w, table, tier], f.rows[tier])
            families["bytes"].add_metric([w, table, tier], f.bytes[tier])
        for key, value in (
            ("read", f.store_read_per_s),
            ("written", f.store_written_per_s),
            ("pinned", f.pinned_rows),
            ("pending", f.pending_keys),
            ("staged", f.rows_staged),
            ("admitted", f.rows_admitted),
            ("expired", f.rows_expired),
        ):
            families[key].add_metric([w, table], value)
    for (_, stage), s in sorted(stage_seconds(w).items()):
        families["seconds"].add_metric([w, stage], s)
    last, total = m.network_figures()
    for kind, net in last.items():
        for direction in ("sent", "received"):
            families["net_pass"].add_metric([w, kind, direction], net.get(direction, 0))
            families["net_min"].add_metric([w, kind, direction], net.get(f"min_{direction}", 0))
    for kind, net in total.items():
        for direction in ("sent", "received"):
            families["net_total"].add_metric([w, kind, direction], net[direction])


_COLLECTOR: _Collector | None = None
_COLLECTOR_LOCK = threading.Lock()


def collector() -> _Collector:
    """The process's collector, registered with prometheus_client's registry once."""
    global _COLLECTOR
    with _COLLECTOR_LOCK:
        if _COLLECTOR is None:
            from prometheus_client import REGISTRY

            c = _Collector()
            REGISTRY.register(c)
            _COLLECTOR = c
        return _COLLECTOR

"""What ``GET /metrics`` says, in Prometheus' text format (prometheus_client, one registry per
server process: every process of a ``--processes N`` server counts its own requests and says
its ``pid``).

::

    daskhps_serve_request_seconds{batch="64"}   histogram of request latency, by batch size
                                                (the bucket's upper bound: 1, 64, 1024, 16384,
                                                more), parse to answer, queueing included
    daskhps_serve_requests_total{code="200"}    requests answered, by HTTP status
    daskhps_serve_rows_total                    rows scored
    daskhps_serve_rows_per_second               rows scored a second over the last 10 s
    daskhps_serve_hit_rate{tier="device"}       share of looked-up rows each tier gave
                                                (device, host, store, init)
    daskhps_serve_version_info{version="v2"}    1 for the version served
    daskhps_serve_refreshes_total{how="replay"} moves to a new version (replay, diff, full, new)
    daskhps_serve_refresh_pause_seconds         how long the last refresh held requests
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["BATCH_BUCKETS", "ServerMetrics", "batch_label"]

BATCH_BUCKETS = (1, 64, 1024, 16384)
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
_RATE_WINDOW_S = 10.0


def batch_label(rows: int) -> str:
    """The batch-size bucket of a request: the smallest bound it fits, or ``more``."""
    for bound in BATCH_BUCKETS:
        if rows <= bound:
            return str(bound)
    return "more"


class _Live(Collector):
    """Gauges read when scraped: the tiers' hit rates and the version served."""

    def __init__(self, hit_rate: Callable[[], Mapping[str, float]], version: Callable[[], str]):
        self._hit_rate = hit_rate
        self._version = version

    def collect(self) -> Iterator[Metric]:
        rates = GaugeMetricFamily(
            "daskhps_serve_hit_rate", "Share of looked-up rows each tier gave", labels=["tier"]
        )
        for tier, rate in self._hit_rate().items():
            rates.add_metric([tier], rate)
        yield rates
        info = GaugeMetricFamily(
            "daskhps_serve_version_info", "The version served (1)", labels=["version", "pid"]
        )
        info.add_metric([self._version(), str(os.getpid())], 1.0)
        yield info


class ServerMetrics:
    """The counters of one server process."""

    def __init__(
        self, hit_rate: Callable[[], Mapping[str, float]], version: Callable[[], str]
    ) -> None:
        self.registry = r = CollectorRegistry()
        self.latency = Histogram(
            "daskhps_serve_request_seconds",
            "Request latency by batch size (rows), from the body read to the answer",
            ["batch"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "daskhps_serve_requests", "Requests answered, by HTTP status", ["code"], registry=r
        )
        self.rows = Counter("daskhps_serve_rows", "Rows scored", registry=r)
        self.refreshes = Counter(
            "daskhps_serve_refreshes", "Moves to another version, by how", ["how"], registry=r
        )
        self.pause = Gauge(
            "daskhps_serve_refresh_pause_seconds",
            "How long the last refresh held requests",
            registry=r,
        )
        rate = Gauge(
            "daskhps_serve_rows_per_second",
            f"Rows scored a second over the last {_RATE_WINDOW_S:g} s",
            registry=r,
        )
        rate.set_function(self._rate)
        r.register(_Live(hit_rate, version))
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()
        # A request counts on children of the labels it had before: labels() costs a lookup
        # under a lock, each time.
        self._latency = {b: self.latency.labels(b) for b in (*map(str, BATCH_BUCKETS), "more")}
        self._requests = {200: self.requests.labels("200")}

    def answered(self, status: int) -> None:
        child = self._requests.get(status)
        if child is None:
            child = self._requests[status] = self.requests.labels(str(status))
        child.inc()

    def scored(self, rows: int, seconds: float) -> None:
        self._latency[batch_label(rows)].observe(seconds)
        self.rows.inc(rows)
        now = time.monotonic()
        with self._lock:
            self._recent.append((now, rows))
            self._forget(now)  # the window's alone, scraped or not

    def _forget(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - _RATE_WINDOW_S:
            self._recent.popleft()

    def _rate(self) -> float:
        with self._lock:
            self._forget(time.monotonic())
            return sum(n for _, n in self._recent) / _RATE_WINDOW_S

    def text(self) -> bytes:
        return generate_latest(self.registry)

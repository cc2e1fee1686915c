"""How far behind its logs a follower is, for the people watching it: ``<run.dir>/follow.json``
and gauges on the process's Prometheus registry (the embedded cluster's dashboard serves it on
``/metrics``)."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from daskhps.retrain._atomic import write_atomic

__all__ = ["STATUS", "FollowStatus", "exported"]

STATUS = "follow.json"


@dataclass
class FollowStatus:
    """How far behind its logs a follower is; written to ``<run.dir>/follow.json`` after
    each listing and each chunk, and exported as Prometheus gauges."""

    started: float = field(default_factory=time.time)
    listed: float = 0.0  # the last listing that succeeded
    waiting: int = 0  # complete chunks not trained yet
    trained: int = 0  # chunks trained by this follower
    published: str | None = None  # the version current now
    newest_landed: float = 0.0  # when the newest chunk a published version trained landed
    listing_error: str | None = None  # why the last listing failed (None: it did not)
    progressive: dict[str, float] = field(default_factory=dict)  # the last chunk's, before

    def lag_seconds(self, now: float | None = None) -> float:
        """Seconds since the newest trained chunk landed (NaN before the first)."""
        if not self.newest_landed:
            return math.nan
        return max(0.0, (now or time.time()) - self.newest_landed)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "lag_seconds": self.lag_seconds()}

    def write(self, run_dir: Path) -> None:
        write_atomic(run_dir / STATUS, json.dumps(self.to_json(), indent=2) + "\n")


_STATUS_NOW: list[FollowStatus] = []  # the followers of this process, for /metrics


class _FollowCollector:
    """``daskhps_follow_*`` gauges of the followers of this process."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        gauges = {
            "lag_seconds": "seconds since the newest chunk a published version trained on landed",
            "chunks_waiting": "complete chunks not trained yet",
            "chunks_trained": "chunks this follower trained",
            "progressive_auc": "AUC of the published model on the last chunk, before training",
            "progressive_logloss": "logloss of the published model on the last chunk, before",
        }
        fams = {k: GaugeMetricFamily(f"daskhps_follow_{k}", h) for k, h in gauges.items()}
        for st in list(_STATUS_NOW):
            fams["lag_seconds"].add_metric([], st.lag_seconds())
            fams["chunks_waiting"].add_metric([], st.waiting)
            fams["chunks_trained"].add_metric([], st.trained)
            fams["progressive_auc"].add_metric([], st.progressive.get("auc", math.nan))
            fams["progressive_logloss"].add_metric([], st.progressive.get("logloss", math.nan))
        yield from fams.values()


_COLLECTOR: list[_FollowCollector] = []


@contextlib.contextmanager
def exported(status: FollowStatus) -> Iterator[None]:
    """``status`` on the process's ``/metrics`` while the follower runs."""
    try:
        from prometheus_client import REGISTRY
    except ImportError:  # the metrics extra is not installed: follow.json only
        yield
        return
    if not _COLLECTOR:
        _COLLECTOR.append(_FollowCollector())
        REGISTRY.register(_COLLECTOR[0])
    _STATUS_NOW.append(status)
    try:
        yield
    finally:
        _STATUS_NOW.remove(status)

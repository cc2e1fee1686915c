"""Seconds per pipeline stage, for the dashboard's Fine Performance Metrics page and /metrics.

Wrap a stage's work in :func:`stage_span`::

    from daskhps.stages import stage_span

    with stage_span("checkpoint"):
        ...

Inside a Dask task the time goes to ``distributed.metrics.context_meter``, so the dashboard's
Fine Performance Metrics page shows it under the task's prefix with the stage as its label.
Every span, in a task or not, also adds to a per-process total by (worker, stage) that the
workers' ``/metrics`` endpoint exports as ``daskhps_stage_seconds_total``.

Spans nest the way ``context_meter`` does: an outer span's time excludes its inner spans
(``read`` excludes the ``hash`` inside it), so the stages add up to the wall time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable, Iterator

__all__ = ["STAGES", "stage_seconds", "stage_span"]

STAGES = (
    "read",
    "hash",
    "dedup",
    "shuffle",
    "stage",
    "admit",
    "count",
    "expire",
    "train",
    "eval",
    "holdout",
    "write-back",
    "checkpoint",
)
CLIENT = "client"  # the `where` of spans outside any Dask worker (the driver)

_TOTALS: dict[tuple[str, str], float] = {}
_LOCK = threading.Lock()
_KEY = "daskhps-stage"  # one key: an inner span's callback replaces the outer one's


def _where() -> str:
    from distributed.worker import get_worker

    try:
        return str(get_worker().address)
    except ValueError:  # not inside a task of a worker
        return CLIENT


@contextlib.contextmanager
def stage_span(stage: str) -> Iterator[None]:
    """Meter the ``with`` block as ``stage`` (one of :data:`STAGES`)."""
    # Imported here, not at the top: daskhps.data.parse meters its stages with this module, and
    # the data, config and table layers must import without distributed (tests/test_layering.py).
    from distributed.metrics import context_meter

    if stage not in STAGES:
        raise ValueError(f"stage {stage!r} is not one of {', '.join(STAGES)}")
    where = _where()

    def record(label: Hashable, value: float, unit: str) -> None:
        if label == stage and unit == "seconds":
            with _LOCK:
                _TOTALS[(where, stage)] = _TOTALS.get((where, stage), 0.0) + value

    with context_meter.add_callback(record, key=_KEY), context_meter.meter(stage):
        yield


def stage_seconds(where: str | None = None) -> dict[tuple[str, str], float]:
    """Seconds so far by ``(where, stage)`` in this process; ``where`` filters by worker
    address (or ``"client"``)."""
    with _LOCK:
        return {k: v for k, v in _TOTALS.items() if where is None or k[0] == where}

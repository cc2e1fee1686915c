"""Watching a run: worker figures on the Dask dashboard and ``/metrics``, stage timings,
and the run report.

* :func:`stage_span` meters a stage (Fine Performance Metrics page, ``/metrics``);
* :class:`ShardMetrics` feeds the dashboard's Workers table and ``/metrics`` from a worker's
  :class:`~daskhps.distributed.WorkerShards`;
* :mod:`daskhps.monitor.report` writes the run report (imported on use: it needs matplotlib).
"""

from daskhps.monitor.stages import STAGES, stage_seconds, stage_span
from daskhps.monitor.worker_metrics import ShardMetrics, TableFigures, announce_pass, metric_name

__all__ = [
    "STAGES",
    "ShardMetrics",
    "TableFigures",
    "announce_pass",
    "metric_name",
    "stage_seconds",
    "stage_span",
]

"""Watching a run: worker figures on the Dask dashboard and ``/metrics``, and the run report.

* :class:`ShardMetrics` feeds the dashboard's Workers table and ``/metrics`` from a worker's
  :class:`~daskhps.distributed.WorkerShards`, with the stage timings every layer meters
  (:func:`daskhps.stages.stage_span`);
* :mod:`daskhps.monitor.report` writes the run report (imported on use: it needs matplotlib).
"""

from daskhps.monitor.worker_metrics import ShardMetrics, TableFigures, announce_pass, metric_name

__all__ = ["ShardMetrics", "TableFigures", "announce_pass", "metric_name"]

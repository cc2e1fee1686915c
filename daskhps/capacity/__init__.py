"""Sizing a run before it starts: each worker's peak memory by part, pass working sets, disk.

* :mod:`~daskhps.capacity.estimate` — bytes of each tier, index and buffer, from the same
  arithmetic the tiers allocate with, and the worker process's own size (measured);
* :mod:`~daskhps.capacity.activations` — bytes per example of a training and an evaluation
  batch, measured on the configured model;
* :mod:`~daskhps.capacity.keystats` — distinct keys per owner and per pass, counted from the
  logs (``--scan``) or taken from the config;
* :mod:`~daskhps.capacity.memory` — the busiest worker's peak memory by part, for those keys;
* :mod:`~daskhps.capacity.stored` — the rows a resumed or imported run's stores already hold;
* :mod:`~daskhps.capacity.disk` — the zarr stores, their history and checkpoints;
* :mod:`~daskhps.capacity.fit` — the report ``daskhps plan`` prints, and the check that makes
  ``train`` refuse a run that cannot fit; with several tables, each table's part of it.
"""

from __future__ import annotations

from daskhps.capacity.disk import DiskEstimate, store_disk
from daskhps.capacity.estimate import TierBytes, dense_bytes, slot_cache_bytes
from daskhps.capacity.fit import SizingReport, TablePlan, check_fits, size_run
from daskhps.capacity.keystats import KeyStats, TableKeys, expected_key_stats, scan_key_stats
from daskhps.capacity.memory import TableMemory, WorkerMemory

__all__ = [
    "DiskEstimate",
    "KeyStats",
    "SizingReport",
    "TableKeys",
    "TableMemory",
    "TablePlan",
    "TierBytes",
    "WorkerMemory",
    "check_fits",
    "dense_bytes",
    "expected_key_stats",
    "scan_key_stats",
    "size_run",
    "slot_cache_bytes",
    "store_disk",
]

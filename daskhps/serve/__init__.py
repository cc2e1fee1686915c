"""Serving: a read-only hierarchical lookup for inference, batch scoring, and export.

* :class:`ServingLookup` — ``keys -> rows`` through device cache -> host memory -> the rank
  stores of a committed table version (never written), refreshed by deltas;
* :class:`TablesLookup` — the same over several tables (a run's ``tables:``), one
  :class:`ServingLookup` per table behind one lookup of tagged keys;
* :func:`load_servable` — a checkpoint (or a run's latest) as config + dense weights + tables;
* :mod:`daskhps.serve.score` — parsed log rows to click probabilities (the trainer's batch
  path, as one rank); :mod:`daskhps.serve.predict` — that, one task per file on a Dask
  cluster, to parquet (both import dask);
* :mod:`daskhps.serve.export` — TorchScript dense model beside an embedding dump.
"""

from __future__ import annotations

from daskhps.serve.lookup import RefreshReport, ServingLookup
from daskhps.serve.stores import ShardedStores
from daskhps.serve.tables import TablesLookup
from daskhps.serve.version import Servable, TableVersion, load_servable
from daskhps.table.read_path import initial_rows  # the table's own, re-exported

__all__ = [
    "RefreshReport",
    "Servable",
    "ServingLookup",
    "ShardedStores",
    "TableVersion",
    "TablesLookup",
    "initial_rows",
    "load_servable",
]

"""A sharded embedding table: one shard's tier stack, staging, sparse optimizers."""

from __future__ import annotations

from daskhps.table.optimizers import OptimizerSpec
from daskhps.table.spec import TableSpec
from daskhps.table.table import EmbeddingTable, StageReport, open_shard_store

__all__ = ["EmbeddingTable", "OptimizerSpec", "StageReport", "TableSpec", "open_shard_store"]

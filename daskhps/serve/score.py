"""Batch scoring: click logs in, one click probability per row out, through the serving lookup.

One task per input file, on any worker (no process group, no collective)::

    file i ──read_shard (the model's schema)──► rows
           ──Scorer: batches ──batch_forward (the trainer's own eval path, one rank)──►
             keys ──ServingLookup of this worker (device -> host -> every rank store, "r")
           ──sigmoid──► <out>/part-<i>.parquet   file | row | probability

Every worker keeps one :class:`Scorer` per prediction job: the dense model and a read-only
lookup over *all* rank stores (HPS-style: each inference node sees the whole table through
its caches), so files are scored independently and the job scales with workers. The stores
must be readable from every worker (a shared or local filesystem).

Row ids: ``(file, row)``, where ``file`` is the input path and ``row`` the 0-based position
of the example among the rows of that file that parsed (bad rows skipped under the model's
bad-row policy have no prediction; ``_predict.json`` counts them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from daskhps.data.schema import Schema
from daskhps.distributed import Exchange
from daskhps.serve.lookup import ServingLookup
from daskhps.serve.version import Servable
from daskhps.sharding import ShardMap
from daskhps.training.examples import RANK, WorkerExamples
from daskhps.training.worker import bag_pooling, batch_forward

__all__ = ["Scorer", "predict_frame"]

LookupFn = Callable[[torch.Tensor], torch.Tensor]


def predict_frame(
    model: torch.nn.Module,
    schema: Schema,
    lookup_fn: LookupFn,
    frame: pd.DataFrame,
    *,
    num_shards: int,
    batch_size: int = 4096,
) -> np.ndarray:
    """Click probabilities (``float32[len(frame)]``, frame order) of parsed log rows.

    Batches go through :func:`daskhps.training.worker.batch_forward` exactly as the trainer's
    evaluation does, as one rank: ``lookup_fn(unique keys) -> embedding rows``.
    """
    n = len(frame)
    if n == 0:
        return np.zeros(0, dtype=np.float32)
    nb = -(-n // batch_size)
    # Rank = row position: WorkerExamples cuts batches by rank, as it does a worker's share.
    data = WorkerExamples.from_frame(
        frame.assign(**{RANK: np.arange(n, dtype=np.int64)}), schema, batch_size, nb
    )
    exchange = Exchange(None, ShardMap(num_shards, 1))
    pooling = bag_pooling(schema)
    out = np.empty(n, dtype=np.float32)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for b in range(nb):
                dense, keys, offsets, _ = data.batch(b)
                logits, _, _ = batch_forward(
                    model, exchange, lookup_fn, dense, keys, offsets, pooling
                )
                lo = int(data.starts[b])
                out[lo : lo + len(logits)] = torch.sigmoid(logits).cpu().numpy()
    finally:
        model.train(was_training)
    return out


@dataclass(frozen=True)
class CacheSizes:
    """Serving caches of one worker: device rows and host-memory bytes."""

    device_rows: int = 1 << 20
    host_bytes: int = 256 << 20
    device: str = "cpu"


class Scorer:
    """The dense model and a serving lookup, shared by the threads of one process."""

    def __init__(self, servable: Servable, sizes: CacheSizes, batch_size: int = 4096) -> None:
        self.servable = servable
        self.model = servable.build_model()
        self.schema = servable.config.data.schema
        self.batch_size = batch_size
        self.lookup = ServingLookup(
            servable.table,
            device_rows=sizes.device_rows,
            host_bytes=sizes.host_bytes,
            device=sizes.device,
            policy=servable.config.table.tiers.policy,
        )
        self._lock = threading.Lock()  # the caches are not thread-safe; the model is

    def _lookup(self, keys: torch.Tensor) -> torch.Tensor:
        with self._lock:  # batch_forward asks for a batch's unique keys
            return self.lookup.lookup(keys, unique=True)

    def score(self, frame: pd.DataFrame) -> np.ndarray:
        """Click probabilities of parsed log rows, in frame order."""
        return predict_frame(
            self.model,
            self.schema,
            self._lookup,
            frame,
            num_shards=self.servable.table.num_shards,
            batch_size=self.batch_size,
        )

    def close(self) -> None:
        with self._lock:
            self.lookup.close()

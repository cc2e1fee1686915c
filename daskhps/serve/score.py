"""Batch scoring: click logs in, one click probability per row out, through the serving lookup.

One task per input file, on any worker (no process group, no collective)::

    file i ──read_shard (the model's schema)──► rows ──Inputs (dense, keys)──►
           ──Scorer: batches, each as the trainer's evaluation runs it (one rank, bit for bit)
             unique keys ──ServingLookup of this worker (device -> host -> every rank store)
           ──sigmoid──► <out>/part-<i>.parquet   file | row | probability

``daskhps serve`` scores a request's rows with the same :class:`Scorer` (daskhps.serve.online).

A run with several embedding tables is scored the same way: its keys carry their table
(daskhps.data.keyspace), a :class:`~daskhps.serve.tables.TablesLookup` looks each up in its
table's caches and stores, and the model's input is laid out as the trainer's
(``field_columns``: flat ``[B, sum of the fields' widths]`` when the widths differ).

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
from daskhps.distributed.exchange import Routing
from daskhps.serve.inputs import Inputs
from daskhps.serve.lookup import PreparedRefresh, RefreshReport, ServingLookup
from daskhps.serve.tables import PreparedTables, TablesLookup
from daskhps.serve.version import Servable
from daskhps.training.model_input import BagPooling, bag_pooling, field_columns, sparse_input

__all__ = ["Scorer", "predict_frame", "score_inputs"]

LookupFn = Callable[[torch.Tensor], torch.Tensor]


def score_inputs(
    model: torch.nn.Module,
    pooling: BagPooling | None,
    lookup_fn: LookupFn,
    inputs: Inputs,
    batch_size: int = 4096,
    columns: torch.Tensor | None = None,
) -> np.ndarray:
    """Click probabilities (``float32[n]``, row order) of parsed rows, ``batch_size`` rows a
    forward, with ``model`` in eval mode. ``columns``: tables of different widths, the
    trainer's :func:`~daskhps.training.model_input.field_columns` (the rows then are padded to
    the widest).

    Each batch as the trainer's evaluation runs it as one rank
    (:func:`daskhps.training.model_input.batch_forward`), bit for bit, without what a rank needs
    and a scorer does not (the routing's position groups, a leaf for gradients): the batch's
    unique keys, sorted, ``lookup_fn(unique keys) -> rows``, ``rows[inverse]`` (pooled bag by
    bag for multi-hot schemas) as the model's ``sparse`` input.
    """
    n = len(inputs)
    out = np.empty(n, dtype=np.float32)
    with torch.no_grad():
        for lo in range(0, n, batch_size):
            hi = min(lo + batch_size, n)
            dense, keys, offsets = inputs.batch(lo, hi)
            # torch.unique(sorted=True, return_inverse=True) by a hash table: no sort of every key
            inverse_np, uniq_np = pd.factorize(keys.reshape(-1).numpy(), sort=True)
            uniq, inverse = torch.from_numpy(uniq_np), torch.from_numpy(inverse_np)
            rows = lookup_fn(uniq).cpu()
            k = [len(uniq)]
            routing = Routing(uniq, inverse.reshape(keys.shape), k, uniq, k)
            logits = model(dense, sparse_input(rows, routing, offsets, pooling, columns))
            out[lo:hi] = torch.sigmoid(logits).numpy()
    return out


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

    Batches score exactly as the trainer's evaluation scores them, as one rank (see
    :func:`score_inputs`): ``lookup_fn(unique keys) -> embedding rows``. ``num_shards`` is
    the table's (one rank owns every shard).
    """
    del num_shards  # one rank: every key is its own
    was_training = model.training
    model.eval()
    try:
        inputs = Inputs.from_frame(frame, schema)
        return score_inputs(model, bag_pooling(schema), lookup_fn, inputs, batch_size)
    finally:
        model.train(was_training)


@dataclass(frozen=True)
class CacheSizes:
    """Serving caches of one worker: device rows and host-memory bytes."""

    device_rows: int = 1 << 20
    host_bytes: int = 256 << 20
    device: str = "cpu"


def open_lookup(servable: Servable, sizes: CacheSizes) -> ServingLookup | TablesLookup:
    """The serving lookup of ``servable``'s table, or of its several tables (the caches split
    over them by how many fields each serves)."""
    policy = servable.config.table.tiers.policy
    if not servable.several_tables:
        return ServingLookup(
            servable.table,
            device_rows=sizes.device_rows,
            host_bytes=sizes.host_bytes,
            device=sizes.device,
            policy=policy,
        )
    at = servable.config.field_tables()
    return TablesLookup(
        servable.tables,
        device_rows=sizes.device_rows,
        host_bytes=sizes.host_bytes,
        device=sizes.device,
        policy=policy,
        fields=[at.count(i) for i in range(len(servable.tables))],
    )


class Scorer:
    """The dense model and a serving lookup, shared by the threads of one process."""

    def __init__(self, servable: Servable, sizes: CacheSizes, batch_size: int = 4096) -> None:
        self.servable = servable
        self.model = servable.build_model()  # in eval mode; a refresh puts another one here
        self.schema = servable.config.data.schema
        self.pooling = bag_pooling(self.schema)
        self.batch_size = batch_size
        self.lookup = open_lookup(servable, sizes)
        cfg = servable.config
        self.columns = field_columns(cfg.sparse_widths()) if servable.several_tables else None
        self._lock = threading.Lock()  # the caches are not thread-safe; the model is

    def _lookup(self, keys: torch.Tensor) -> torch.Tensor:
        with self._lock:  # unique keys of one batch
            return self.lookup.lookup(keys, unique=True)

    def score_inputs(self, inputs: Inputs) -> np.ndarray:
        """Click probabilities of parsed rows' inputs, in row order."""
        model = self.model
        if model.training:
            model.eval()
        return score_inputs(
            model, self.pooling, self._lookup, inputs, self.batch_size, self.columns
        )

    def prepare(self, servable: Servable) -> PreparedRefresh | PreparedTables:
        """Open ``servable``'s tables (the same tables, a newer commit) beside the served
        ones and find the delta (:meth:`ServingLookup.prepare`; any thread)."""
        if isinstance(self.lookup, TablesLookup):
            return self.lookup.prepare(servable.tables)
        return self.lookup.prepare(servable.table)

    def refresh(self, prepared: PreparedRefresh | PreparedTables) -> RefreshReport:
        """Move the caches to what :meth:`prepare` opened (between two scorings)."""
        with self._lock:
            if isinstance(self.lookup, TablesLookup):
                assert isinstance(prepared, PreparedTables)
                return self.lookup.refresh(prepared)
            assert isinstance(prepared, PreparedRefresh)
            return self.lookup.refresh(prepared)

    def score(self, frame: pd.DataFrame) -> np.ndarray:
        """Click probabilities of parsed log rows, in frame order."""
        return self.score_inputs(Inputs.from_frame(frame, self.schema))

    def close(self) -> None:
        with self._lock:
            self.lookup.close()

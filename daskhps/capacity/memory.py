"""The memory model of a run's busiest worker: each table's tiers and store, the dense model,
the examples it reads and routes, and the transients, summed into its peak.

:func:`worker_memory` prices every part with :mod:`~daskhps.capacity.estimate` (the tiers'
own allocation arithmetic) and :mod:`~daskhps.capacity.activations` (a batch's bytes) for the
key counts of :mod:`~daskhps.capacity.keystats`; :mod:`~daskhps.capacity.fit` weighs the result
against the memory limit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from daskhps.capacity.activations import StepBytes, step_bytes
from daskhps.capacity.estimate import (
    WORKER_PROCESS_BYTES,
    TierBytes,
    dense_bytes,
    flush_step_bytes,
    host_tier_bytes,
    index_transient_bytes,
    slot_cache_bytes,
    store_mapped_bytes,
    store_memory_bytes,
    summed_tiers,
)
from daskhps.capacity.keystats import KeyStats
from daskhps.capacity.stored import StoredTable
from daskhps.config import RunConfig

__all__ = [
    "TableMemory",
    "WorkerMemory",
    "dense_param_count",
    "keys_holdout",
    "local_memory_limit",
    "worker_memory",
]

log = logging.getLogger(__name__)

# Per example in worker memory: label, dense floats, int64 keys (pandas), and the routed copy's
# rank column.
_ROW_LABEL, _DENSE, _KEY, _RANK = 4, 4, 8, 8
# Copies of a holdout chunk's rows a worker holds at the start of an evaluation, measured
# (scripts/bench_sizing.py): the chunk being evaluated as read, split by worker, gathered,
# sorted by rank and made into tensors, while the next chunk is read.
_HOLDOUT_COPIES = 6


def _tier(t: TierBytes | None) -> dict[str, int | None] | None:
    if t is None:
        return None
    return {
        "rows": t.rows,
        "width": t.width,
        "slab": t.slab,
        "metadata": t.metadata,
        "index": t.index,
        "scratch": t.scratch,
        "total": t.total,
    }


@dataclass(frozen=True)
class TableMemory:
    """One table's part of a worker's memory: its device and host tiers and its zarr store
    (``store_index``: the moment its store's key index is opened or grown, a transient)."""

    name: str
    device: TierBytes
    host: TierBytes | None
    store: int
    store_mapped: int
    store_index: int

    @property
    def total(self) -> int:
        """What the table keeps on the worker (its transient aside)."""
        host = self.host.total if self.host else 0
        return self.device.total + host + self.store + self.store_mapped

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": _tier(self.device),
            "host": _tier(self.host),
            "store": self.store,
            "store_mapped": self.store_mapped,
            "store_index": self.store_index,
            "total": self.total,
        }


@dataclass(frozen=True)
class WorkerMemory:
    """Bytes one worker holds for the run, by part (the busiest worker's share).

    ``total`` is the peak resident memory of the worker process: the process itself, what the
    run keeps (tiers, dense model, examples) and the largest of the transients, which never
    overlap: one training batch, one evaluation batch, one step of a checkpoint's flush of
    dirty rows to the store, and the store's key index being opened or grown. With several
    tables the tiers and the store are the sums of :attr:`tables` (``store_index`` the
    largest table's: the stores are opened and grown one at a time).
    """

    memory_limit: int | None
    process: int
    device: TierBytes
    host: TierBytes | None
    store: int
    store_mapped: int
    dense_params: int
    dense: int
    examples: int | None
    train_step: int
    eval_step: int
    flush_step: int
    store_index: int
    tables: tuple[TableMemory, ...] = ()  # each table's part (one: the figures above)

    @property
    def tiers(self) -> int:
        host = self.host.total if self.host else 0
        return self.device.total + host + self.store + self.store_mapped

    @property
    def transients(self) -> dict[str, int]:
        """The moments that never overlap, by what happens in them."""
        return {
            "a training batch": self.train_step,
            "an evaluation batch": self.eval_step,
            "a checkpoint's flush (a step of dirty rows)": self.flush_step,
            "the store's index (opening or growing it)": self.store_index,
        }

    @property
    def transient(self) -> int:
        return max(self.transients.values())

    @property
    def growth(self) -> int:
        """What the run adds to a worker process that has run one before."""
        return self.tiers + self.dense + (self.examples or 0) + self.transient

    @property
    def total(self) -> int:
        return self.process + self.growth

    def to_dict(self) -> dict[str, Any]:
        return {
            "memory_limit": self.memory_limit,
            "process": self.process,
            "device": _tier(self.device),
            "host": _tier(self.host),
            "store": self.store,
            "store_mapped": self.store_mapped,
            "dense_params": self.dense_params,
            "dense": self.dense,
            "examples": self.examples,
            "train_step": self.train_step,
            "eval_step": self.eval_step,
            "flush_step": self.flush_step,
            "store_index": self.store_index,
            "transient": self.transient,
            "tiers": self.tiers,
            "total": self.total,
        }


def local_memory_limit(cfg: RunConfig) -> int | None:
    """The memory limit each worker of the embedded LocalCluster gets (Dask's "auto" splits
    the machine's memory evenly); None for a cluster behind an address."""
    if not cfg.cluster.local:
        return None
    from distributed.worker_memory import parse_memory_limit

    limit = cfg.cluster.memory_limit if cfg.cluster.memory_limit is not None else "auto"
    return parse_memory_limit(limit, 1, cfg.cluster.n_workers, logger=log)


def dense_param_count(cfg: RunConfig) -> int:
    model = cfg.build_model()
    return sum(p.numel() for p in model.parameters())


def _example_bytes(cfg: RunConfig) -> int:
    schema = cfg.data.schema
    return _ROW_LABEL + _DENSE * len(schema.dense_names) + _KEY * len(schema.categorical_names)


def worker_memory(
    cfg: RunConfig,
    keys: KeyStats,
    memory_limit: int | None,
    stored: StoredTable | None = None,
    steps: StepBytes | None = None,
) -> WorkerMemory:
    """The memory model of the busiest worker for ``keys`` and ``memory_limit``; ``stored``
    is the table a resume opens, ``steps`` the dense model's bytes per example (measured when
    not given)."""
    tables = _table_memory(cfg, keys, memory_limit, stored)
    device = summed_tiers([t.device for t in tables])
    assert device is not None
    batch = keys.largest_pass_per_owner or 0
    params = dense_param_count(cfg)
    steps = steps or step_bytes(cfg)
    W = keys.workers
    holdout = keys_holdout(cfg, keys)
    row = _example_bytes(cfg)
    examples = None
    if keys.examples is not None:
        per_pass = -(-min(cfg.passes.plan.examples_per_pass, keys.examples) // W)
        # The log is streamed: what a worker holds of it is the pass being prepared (its
        # partitions, read once for keys and examples), two passes of routed examples (one
        # trains, the next is staged) with a rank column, and their keys (worker, shard, key)
        # on their owners.
        # A pass reads every partition it overlaps whole: up to a partition (a block of
        # data.block_size, or a whole file) beyond each end of the pass, never more than the
        # worker's share of the log.
        block_rows = (cfg.data.block_size or 1 << 30) // max(row, 1)
        read = min(-(-keys.examples // W), per_pass + 2 * block_rows)
        examples = read * row + 2 * per_pass * (row + _RANK) + 2 * batch * 3 * 8
    # The holdout is evaluated in chunks of a pass's examples (or of one batch over all
    # workers, if larger); a holdout batch is eval.batch_size rows on each worker, fewer when
    # a chunk is smaller.
    chunk = min(holdout, max(cfg.passes.plan.examples_per_pass, cfg.eval.batch_size * W))
    eval_rows = min(cfg.eval.batch_size, -(-chunk // W))
    if examples is not None and holdout:
        examples += _HOLDOUT_COPIES * -(-chunk // W) * (row + _RANK)
    return WorkerMemory(
        memory_limit=memory_limit,
        process=WORKER_PROCESS_BYTES,
        device=device,
        host=summed_tiers([t.host for t in tables]),
        store=sum(t.store for t in tables),
        store_mapped=sum(t.store_mapped for t in tables),
        dense_params=params,
        dense=dense_bytes(params, cfg.dense_optimizer.kind),
        examples=examples,
        train_step=steps.train(-(-cfg.passes.plan.global_batch_size // W)),
        eval_step=steps.eval(eval_rows),
        # The tables flush one after another: the widest table's step is the moment's.
        flush_step=max(
            flush_step_bytes(t.device.rows + (t.host.rows if t.host else 0), t.device.width or 0)
            for t in tables
        ),
        store_index=max(t.store_index for t in tables),
        tables=tables,
    )


def _table_memory(
    cfg: RunConfig, keys: KeyStats, memory_limit: int | None, stored: StoredTable | None
) -> tuple[TableMemory, ...]:
    """Each table's tiers and store on the busiest worker: its rows and host bytes as the
    workers resolve them (:meth:`~daskhps.tier_sizing.TierSizing.resolve` over every table,
    a shared budget split by the tables' keys in a pass), at its own width and policy, for
    its own keys."""
    specs = cfg.table_specs()
    sizing = cfg.tier_sizing()
    policy = cfg.table.tiers.policy
    policies = {name: b.policy for name, b in sizing.own if b.policy is not None}
    by_table = keys.by_table([s.name for s in specs])
    # The workers split a shared budget by the keys of the first pass they stage: here the
    # largest pass's stand in for them (known for every table, or the same rows for each).
    pass_keys = {k.name: k.largest_pass_per_owner for k in by_table}
    known = None if None in pass_keys.values() else {n: v or 0 for n, v in pass_keys.items()}
    budgets = sizing.resolve(specs, memory_limit, "cpu", policy, check_budget=False, keys=known)
    out = []
    for spec, k in zip(specs, by_table, strict=True):
        rows, host_budget = budgets[spec.name]
        pol = policies.get(spec.name, policy)
        batch = k.largest_pass_per_owner or 0
        device = slot_cache_bytes(rows, spec.width, pol, batch_keys=batch)
        host = host_tier_bytes(host_budget, spec.width, pol, batch_keys=batch)
        opened = stored.busiest_of(spec.name) if stored else 0
        # Keys of the store's index: those the logs bring, or what it already holds if more
        # (a day's new keys on top of a large stored table are few; the larger count bounds
        # them).
        in_store = max(k.keys_per_owner or 0, opened)
        upper = device.rows + (host.rows if host else 0)
        out.append(
            TableMemory(
                name=spec.name,
                device=device,
                host=host,
                store=store_memory_bytes(in_store, spec.width, batch_keys=batch, opened=opened),
                # Rows are read back from the store (through memory maps) only when the upper
                # tiers cannot hold every key of the shard.
                store_mapped=store_mapped_bytes(in_store, spec.width) if in_store > upper else 0,
                store_index=index_transient_bytes(in_store, opened),
            )
        )
    return tuple(out)


def keys_holdout(cfg: RunConfig, keys: KeyStats) -> int:
    """Held-out examples (evaluated on the workers), as far as the config tells."""
    h, gen = cfg.data.holdout, cfg.data.generate
    if h is None:
        return 0
    if gen is not None and h.day is not None:
        return gen.generator.rows_per_day
    if h.fraction is not None and keys.examples is not None:
        return int(keys.examples * h.fraction / (1.0 - h.fraction))
    if h.progressive and keys.examples is not None:
        return keys.examples
    return 0

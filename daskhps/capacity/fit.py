"""Will a run fit? Memory per tier per worker, the pass working set, disk, as one report.

:func:`size_run` composes the memory model (:mod:`~daskhps.capacity.estimate`), the key
statistics (:mod:`~daskhps.capacity.keystats`) and the disk model
(:mod:`~daskhps.capacity.disk`) for one config. ``daskhps plan`` prints the report; the
trainer calls :func:`check_fits` before it starts a cluster, which raises the report's
refusal (the same text ``plan`` prints) when the run cannot fit.

A problem refuses the run only when it rests on exact arithmetic or on counted (``--scan``)
or stated (``table.expected_keys``) key counts; the same problem from an upper bound is a
warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from daskhps.capacity.disk import DiskEstimate, store_disk
from daskhps.capacity.estimate import (
    TierBytes,
    dense_bytes,
    host_tier_bytes,
    slot_cache_bytes,
    store_mapped_bytes,
    store_memory_bytes,
)
from daskhps.capacity.keystats import KeyStats, expected_key_stats, scan_key_stats
from daskhps.config import RunConfig
from daskhps.config.runconfig import MEMORY_BUDGET, PAUSE_FRACTION
from daskhps.distributed.sizing import TierSizing
from daskhps.errors import CapacityError

__all__ = ["SizingReport", "WorkerMemory", "check_fits", "size_run"]

log = logging.getLogger(__name__)

# Per example in worker memory: label, dense floats, int64 keys (pandas), and the routed copy's
# rank column.
_ROW_LABEL, _DENSE, _KEY, _RANK = 4, 4, 8, 8


@dataclass(frozen=True)
class WorkerMemory:
    """Bytes one worker holds for the run, by part (the busiest worker's share)."""

    memory_limit: int | None
    device: TierBytes
    host: TierBytes | None
    store: int
    store_mapped: int
    dense_params: int
    dense: int
    examples: int | None

    @property
    def tiers(self) -> int:
        host = self.host.total if self.host else 0
        return self.device.total + host + self.store + self.store_mapped

    @property
    def total(self) -> int:
        return self.tiers + self.dense + (self.examples or 0)

    def to_dict(self) -> dict[str, Any]:
        def tier(t: TierBytes | None) -> dict[str, int] | None:
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

        return {
            "memory_limit": self.memory_limit,
            "device": tier(self.device),
            "host": tier(self.host),
            "store": self.store,
            "store_mapped": self.store_mapped,
            "dense_params": self.dense_params,
            "dense": self.dense,
            "examples": self.examples,
            "tiers": self.tiers,
            "total": self.total,
        }


@dataclass(frozen=True)
class SizingReport:
    """The sizing of one run: what ``daskhps plan`` prints."""

    source: str
    workers: int
    keys: KeyStats
    memory: WorkerMemory | None
    disk: DiskEstimate
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems

    def refusal(self) -> str:
        """One line: why the run cannot fit and what would fix it."""
        return f"{self.source}: the run cannot fit: " + "; also ".join(self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.source,
            "workers": self.workers,
            "keys": self.keys.to_dict(),
            "memory_per_worker": self.memory.to_dict() if self.memory else None,
            "disk": self.disk.to_dict(),
            "fits": self.fits,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
        }


def local_memory_limit(cfg: RunConfig) -> int | None:
    """The memory limit each worker of the embedded LocalCluster gets (Dask's "auto" splits
    the machine's memory evenly); None for a cluster behind an address."""
    if not cfg.cluster.local:
        return None
    from distributed.worker_memory import parse_memory_limit

    limit = cfg.cluster.memory_limit if cfg.cluster.memory_limit is not None else "auto"
    return parse_memory_limit(limit, 1, cfg.cluster.n_workers, logger=log)


def _tier_sizing(cfg: RunConfig) -> TierSizing:
    """The trainer's sizing of the tiers (``Trainer._sizing``)."""
    tiers = cfg.table.tiers
    return TierSizing(
        device_fraction=tiers.device.fraction if tiers.device.rows is None else None,
        device_rows=tiers.device.rows,
        host_fraction=tiers.host.fraction or None,
    )


def dense_param_count(cfg: RunConfig) -> int:
    schema = cfg.data.schema
    model = cfg.model.build(
        num_dense=len(schema.dense_names),
        num_fields=len(schema.categorical_names),
        embedding_dim=cfg.table.dim,
    )
    return sum(p.numel() for p in model.parameters())


def _example_bytes(cfg: RunConfig) -> int:
    schema = cfg.data.schema
    return _ROW_LABEL + _DENSE * len(schema.dense_names) + _KEY * len(schema.categorical_names)


def worker_memory(cfg: RunConfig, keys: KeyStats, memory_limit: int | None) -> WorkerMemory:
    """The memory model of the busiest worker for ``keys`` and ``memory_limit``."""
    spec = cfg.table_spec()
    policy = cfg.table.tiers.policy
    rows, host_budget = _tier_sizing(cfg).resolve([spec], memory_limit, "cpu", policy)[spec.name]
    batch = keys.largest_pass_per_owner or 0
    device = slot_cache_bytes(rows, spec.width, policy, batch_keys=batch)
    host = host_tier_bytes(host_budget, spec.width, policy, batch_keys=batch)
    stored = keys.keys_per_owner or 0
    upper = device.rows + (host.rows if host else 0)
    store = store_memory_bytes(stored, spec.width, batch_keys=batch)
    params = dense_param_count(cfg)
    examples = None
    if keys.examples is not None:
        W = keys.workers
        row = _example_bytes(cfg)
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
        holdout = keys_holdout(cfg, keys)
        if holdout:
            # Evaluated in chunks of at most a pass: two chunks in flight, read and routed.
            chunk = -(-min(holdout, cfg.passes.plan.examples_per_pass) // W)
            examples += 2 * chunk * (row + _RANK)
    return WorkerMemory(
        memory_limit=memory_limit,
        device=device,
        host=host,
        store=store,
        # Rows are read back from the store (through memory maps) only when the upper tiers
        # cannot hold every key of the shard.
        store_mapped=store_mapped_bytes(stored, spec.width) if stored > upper else 0,
        dense_params=params,
        dense=dense_bytes(params, cfg.dense_optimizer.kind),
        examples=examples,
    )


def keys_holdout(cfg: RunConfig, keys: KeyStats) -> int:
    """Held-out examples (evaluated on the workers), as far as the config tells."""
    h, gen = cfg.data.holdout, cfg.data.generate
    if h is None:
        return 0
    if gen is not None and h.day is not None:
        return gen.generator.rows_per_day
    if h.fraction is not None and keys.examples is not None:
        return int(keys.examples * h.fraction / (1.0 - h.fraction))
    return 0


def size_run(
    cfg: RunConfig,
    *,
    scan: bool = False,
    workers: int | None = None,
    memory_limit: int | None = None,
) -> SizingReport:
    """Size ``cfg``: key statistics (counted with ``scan``), memory, disk and the verdict.

    ``workers`` and ``memory_limit`` describe a cluster behind ``cluster.address``; for the
    embedded cluster they come from the config.
    """
    if cfg.cluster.local:
        workers, memory_limit = cfg.cluster.n_workers, local_memory_limit(cfg)
    W = workers or 1
    keys = scan_key_stats(cfg, W) if scan else expected_key_stats(cfg, W)
    problems: list[str] = []
    warnings: list[str] = []
    sure = keys.certain
    memory = None
    if workers is not None:
        memory = worker_memory(cfg, keys, memory_limit)
        _check_memory(cfg, keys, memory, problems, warnings)
    else:
        warnings.append(
            "worker count and memory limit unknown (cluster.address): memory not sized; "
            "run `daskhps plan` where the scheduler is reachable"
        )
    if keys.source == "unknown" or keys.distinct_keys is None:
        warnings.append(
            "distinct keys unknown: store disk not sized; pass --scan or set table.expected_keys"
        )
    disk = _disk(cfg, keys)
    if disk.total is not None and disk.free is not None and disk.total > disk.free:
        msg = (
            f"the stores and checkpoints need about {_gib(disk.total)} on {disk.path}, which "
            f"has {_gib(disk.free)} free; free disk, move table.tiers.store_dir, or keep "
            "fewer checkpoints"
        )
        (problems if sure else warnings).append(msg + ("" if sure else " (from an upper bound)"))
    return SizingReport(cfg.source, W, keys, memory, disk, problems, warnings)


def _check_memory(
    cfg: RunConfig,
    keys: KeyStats,
    memory: WorkerMemory,
    problems: list[str],
    warnings: list[str],
) -> None:
    rows = memory.device.rows
    need = keys.largest_pass_per_owner
    if need is not None and need > rows:
        msg = (
            f"the largest pass stages {need:,} keys on one worker but the device tier holds "
            f"{rows:,} rows ({_device_key(cfg)}); raise the device tier, add workers, or lower "
            "passes.examples_per_pass (or set passes.max_working_set)"
        )
        if keys.certain:
            problems.append(msg)
        else:
            warnings.append(msg + f" (from an upper bound of the {keys.source} key counts)")
    elif need is not None and 2 * need > rows:
        warnings.append(
            f"two passes' working sets ({2 * need:,} keys) exceed the device tier ({rows:,} "
            "rows): each pass is staged after the previous one instead of while it trains"
        )
    limit = memory.memory_limit
    if limit is None:
        return
    if memory.tiers > MEMORY_BUDGET * limit:
        warnings.append(
            f"the tiers take {_gib(memory.tiers)}, {memory.tiers / limit:.2f} of the worker "
            f"memory limit {_gib(limit)} (budget {MEMORY_BUDGET})"
        )
    exact = memory.device.resident + (memory.host.resident if memory.host else 0) + memory.dense
    if memory.total > PAUSE_FRACTION * limit:
        msg = (
            f"one worker needs about {_gib(memory.total)} (tiers {_gib(memory.tiers)}, dense "
            f"model {_gib(memory.dense)}, examples {_gib(memory.examples or 0)}), above "
            f"{PAUSE_FRACTION:.0%} of its memory limit {_gib(limit)}, where Dask pauses it; "
            "raise cluster.memory_limit, add workers or shrink the tiers"
        )
        sure = keys.certain or exact > PAUSE_FRACTION * limit
        (problems if sure else warnings).append(msg + ("" if sure else " (from an upper bound)"))


def _device_key(cfg: RunConfig) -> str:
    d = cfg.table.tiers.device
    return (
        f"table.tiers.device.rows {d.rows}"
        if d.rows
        else f"table.tiers.device.fraction {d.fraction}"
    )


def _disk(cfg: RunConfig, keys: KeyStats) -> DiskEstimate:
    spec = cfg.table_spec()
    epochs = cfg.passes.epochs
    W = keys.workers
    pass_rows = None if keys.largest_pass_per_owner is None else keys.largest_pass_per_owner * W
    written = None
    if keys.pass_keys_per_owner:
        written = epochs * W * sum(keys.pass_keys_per_owner)
    elif keys.passes is not None and pass_rows is not None:
        written = epochs * keys.passes * pass_rows
    checkpoint = getattr(cfg, "checkpoint", None)
    params = dense_param_count(cfg)
    state = 4 * params * (1 + {"sgd": 0, "adagrad": 1, "adam": 2}[cfg.dense_optimizer.kind])
    return store_disk(
        width=spec.width,
        distinct_keys=keys.distinct_keys,
        rows_written=written,
        pass_rows=pass_rows,
        checkpoint=checkpoint,
        snapshot_every=cfg.table.tiers.snapshot_every,
        dense_state_bytes=state,
        store_dir=cfg.table.tiers.store_dir,
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_fits(cfg: RunConfig) -> SizingReport:
    """Size ``cfg`` from the config alone (no scan) and raise when it cannot fit.

    Raises
    ------
    CapacityError
        With :meth:`SizingReport.refusal`, the message ``daskhps plan`` prints.
    """
    report = size_run(cfg)
    for w in report.warnings:
        log.warning("%s", w)
    if not report.fits:
        raise CapacityError(report.refusal())
    return report

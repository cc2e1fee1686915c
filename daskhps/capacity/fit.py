"""Will a run fit? Memory per tier per worker, the pass working set, disk, as one report.

:func:`size_run` composes the memory model (:mod:`~daskhps.capacity.memory`), the key
statistics (:mod:`~daskhps.capacity.keystats`) and the disk model
(:mod:`~daskhps.capacity.disk`) for one config. ``daskhps plan`` prints the report; the
trainer calls :func:`check_fits` before it starts a cluster, which raises the report's
refusal (the same text ``plan`` prints) when the run cannot fit.

A problem refuses the run only when it rests on exact arithmetic or on counted (``--scan``)
or stated (``table.expected_keys``) key counts; the same problem from an upper bound is a
warning, which says it is one. A pass larger than the device tier by an upper bound alone is
no warning to ``train``: the trainer counts every pass's keys when it stages it and stops,
with that count, at one that does not fit, so only ``plan`` says it (:attr:`SizingReport.
upper_bounds`). Whether two passes fit the device tier together is not checked at all: the
trainer stages a pass ahead, beside the one training, only where it fits
(:mod:`daskhps.training.pipeline`).

With several tables every table has its own tiers and stores on every worker, with its own row
width, device rows and host bytes (as :class:`~daskhps.tier_sizing.TierSizing` resolves them
on the workers), so each is sized with its own keys (:class:`TablePlan`) and the worker's
memory and the disk are their sums; a pass pins each table's keys in that table's device tier,
so each table's largest pass must fit its own rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from daskhps.capacity.disk import DiskEstimate, checkpoints_dense_bytes, store_disk, summed_disk
from daskhps.capacity.keystats import KeyStats, TableKeys, expected_key_stats, scan_key_stats
from daskhps.capacity.memory import (
    TableMemory,
    WorkerMemory,
    dense_param_count,
    local_memory_limit,
    worker_memory,
)
from daskhps.capacity.stored import StoredTable, stored_table
from daskhps.config import RunConfig
from daskhps.errors import CapacityError
from daskhps.tier_sizing import MEMORY_BUDGET, PAUSE_FRACTION

__all__ = [
    "SizingReport",
    "TablePlan",
    "check_cluster_fits",
    "check_fits",
    "size_run",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TablePlan:
    """One table of a run with several: what it holds, its keys, its part of each worker's
    memory (None where the memory is not sized) and its stores' disk."""

    name: str
    dim: int
    width: int
    fields: tuple[str, ...]
    keys: TableKeys
    memory: TableMemory | None
    disk: DiskEstimate

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dim": self.dim,
            "width": self.width,
            "fields": list(self.fields),
            "keys": self.keys.to_dict(),
            "memory_per_worker": None if self.memory is None else self.memory.to_dict(),
            "disk": self.disk.to_dict(),
        }


@dataclass(frozen=True)
class SizingReport:
    """The sizing of one run: what ``daskhps plan`` prints."""

    source: str
    workers: int
    keys: KeyStats
    memory: WorkerMemory | None
    disk: DiskEstimate
    stored: StoredTable | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    tables: tuple[TablePlan, ...] = ()  # with several tables, each one's part
    # Passes that an upper bound of their keys puts over the device tier: plan says so, train
    # does not (it stops at a pass whose counted keys do not fit, when it stages it).
    upper_bounds: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems

    def refusal(self) -> str:
        """One line: why the run cannot fit and what would fix it."""
        return f"{self.source}: the run cannot fit: " + "; also ".join(self.problems)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "config": self.source,
            "workers": self.workers,
            "keys": self.keys.to_dict(),
            "stored": (
                None
                if self.stored is None
                else {
                    "checkpoint": self.stored.checkpoint,
                    "rows_per_rank": list(self.stored.rows_per_rank),
                }
            ),
            "memory_per_worker": self.memory.to_dict() if self.memory else None,
            "disk": self.disk.to_dict(),
            "fits": self.fits,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "upper_bounds": list(self.upper_bounds),
        }
        if self.tables:  # one table: its figures are the run's, as they always were
            out["tables"] = [t.to_dict() for t in self.tables]
        return out


# How a figure that rests on an upper bound of the keys says so.
_UPPER_BOUND = "an upper bound; `daskhps plan --scan` counts them"
_KEYS_BOUND = " (from an upper bound of the keys; `daskhps plan --scan` counts them)"

MEMORY_UNKNOWN = (
    "worker count and memory limit unknown (cluster.address): memory not sized; "
    "run `daskhps plan` where the scheduler is reachable"
)


def size_run(
    cfg: RunConfig,
    *,
    scan: bool = False,
    workers: int | None = None,
    memory_limit: int | None = None,
    resume: bool = True,
) -> SizingReport:
    """Size ``cfg``: key statistics (counted with ``scan``), memory, disk and the verdict.

    ``workers`` and ``memory_limit`` describe a cluster behind ``cluster.address``; for the
    embedded cluster they come from the config. With ``resume`` the stores of the run's newest
    checkpoint count (what ``train --resume`` opens); a fresh run starts without them.
    """
    if cfg.cluster.local:
        workers, memory_limit = cfg.cluster.n_workers, local_memory_limit(cfg)
    W = workers or 1
    keys = scan_key_stats(cfg, W) if scan else expected_key_stats(cfg, W)
    stored = stored_table(cfg.run.dir) if resume else None
    problems: list[str] = []
    warnings: list[str] = []
    bounds: list[str] = []
    sure = keys.certain
    memory = None
    if workers is not None:
        memory = worker_memory(cfg, keys, memory_limit, stored)
        _check_memory(cfg, keys, memory, problems, warnings, bounds)
    else:
        warnings.append(MEMORY_UNKNOWN)
    # Unknown distinct keys leave the disk unsized (plan's disk block says so): nothing that
    # may not fit, so no warning.
    disk, disks = _disk(cfg, keys)
    # A cluster's workers each hold their share on their own disk: they check it themselves
    # (daskhps.training.placement); the embedded cluster's all land on this machine's.
    here = cfg.cluster.local
    if here and disk.total is not None and disk.free is not None and disk.total > disk.free:
        msg = (
            f"the stores and checkpoints need about {_gib(disk.total)} on {disk.path}, which "
            f"has {_gib(disk.free)} free; free disk, move table.tiers.store_dir, or keep "
            "fewer checkpoints"
        )
        (problems if sure else warnings).append(msg + ("" if sure else _KEYS_BOUND))
    tables = _table_plans(cfg, keys, memory, disks)
    return SizingReport(
        cfg.source, W, keys, memory, disk, stored, problems, warnings, tables, bounds
    )


def _table_plans(
    cfg: RunConfig,
    keys: KeyStats,
    memory: WorkerMemory | None,
    disks: tuple[DiskEstimate, ...],
) -> tuple[TablePlan, ...]:
    """Each table's part of the report (none with one table: the report's figures are its)."""
    if not disks:
        return ()
    entries = cfg.embedding_tables()
    specs = cfg.table_specs()
    parts = memory.tables if memory is not None else (None,) * len(specs)
    return tuple(
        TablePlan(e.name, e.dim, s.width, tuple(e.features), k, m, d)
        for e, s, k, m, d in zip(
            entries, specs, keys.by_table([s.name for s in specs]), parts, disks, strict=True
        )
    )


def _check_memory(
    cfg: RunConfig,
    keys: KeyStats,
    memory: WorkerMemory,
    problems: list[str],
    warnings: list[str],
    bounds: list[str],
) -> None:
    """The largest pass against the device tier (each table's against its own), then the
    worker's peak against its memory limit."""
    if len(memory.tables) > 1:
        _check_tables(cfg, keys, memory, problems, bounds)
    else:
        _check_pass(cfg, keys, memory.device.rows, problems, bounds)
    limit = memory.memory_limit
    if limit is None:
        return
    if memory.tiers > MEMORY_BUDGET * limit:
        warnings.append(
            f"the tiers take {_gib(memory.tiers)}, {memory.tiers / limit:.2f} of the worker "
            f"memory limit {_gib(limit)} (budget {MEMORY_BUDGET})"
        )
    # What follows from the config by exact arithmetic alone; the process and the transients
    # are measured figures, which decide with counted or stated key counts only.
    exact = memory.device.resident + (memory.host.resident if memory.host else 0) + memory.dense
    if memory.total > PAUSE_FRACTION * limit:
        part, n, fix = _largest_part(cfg, memory)
        raise_limit = (
            "raise cluster.memory_limit"
            if cfg.cluster.local
            else "start the workers with a larger --memory-limit"
        )
        msg = (
            f"one worker needs about {_gib(memory.total)} at its peak, above "
            f"{PAUSE_FRACTION:.0%} of its memory limit {_gib(limit)}, where Dask pauses it; the "
            f"largest part is {part} ({_gib(n)}): {fix}, or {raise_limit}"
        )
        sure = keys.certain or exact > PAUSE_FRACTION * limit
        (problems if sure else warnings).append(msg + ("" if sure else _KEYS_BOUND))


def _check_pass(
    cfg: RunConfig, keys: KeyStats, rows: int, problems: list[str], bounds: list[str]
) -> None:
    """Staging a pass pins its keys in the device tier, so a pass with more keys on one worker
    than the tier's rows cannot train. Counted or stated keys refuse the run; an upper bound
    goes to ``bounds``, which only ``plan`` prints: the trainer counts each pass's keys when it
    stages it, so a run whose passes fit runs without a word and one whose pass does not stops
    there with the count.

    Two passes are not weighed together: the trainer stages pass k+1 beside pass k where both
    fit and once pass k is done where they do not (later, not a failure), deciding for each
    pass with its keys. Two passes' counts added only bound their union from above, so no
    figure here could say whether, or for which passes, that happens."""
    need = keys.largest_pass_per_owner
    if need is None or need <= rows:
        return
    fix = (
        "raise the device tier, add workers, or lower passes.examples_per_pass (or set "
        "passes.max_working_set)"
    )
    if keys.certain:
        problems.append(
            f"the largest pass stages {need:,} keys on one worker but the device tier holds "
            f"{rows:,} rows ({_device_key(cfg)}); {fix}"
        )
    else:
        bounds.append(
            f"a pass stages at most {need:,} keys on one worker ({_UPPER_BOUND}), and the "
            f"device tier holds {rows:,} rows ({_device_key(cfg)}): train stops at a pass "
            f"with more keys than that; {fix}"
        )


def _check_tables(
    cfg: RunConfig,
    keys: KeyStats,
    memory: WorkerMemory,
    problems: list[str],
    bounds: list[str],
) -> None:
    """:func:`_check_pass` for each table against its own device rows (staging a pass pins
    every table's keys in that table's device tier), and, where only the run's key count is
    stated (``table.expected_keys``), the run's largest pass against all of them."""
    names = [t.name for t in memory.tables]
    per_table = keys.by_table(names)
    for i, (part, k) in enumerate(zip(memory.tables, per_table, strict=True)):
        rows, need = part.device.rows, k.largest_pass_per_owner
        if need is None or need <= rows:
            continue
        key, alt = _table_device_key(cfg, i)
        fix = (
            f"a pass pins every table's keys in that table's device tier: raise "
            f"{key.split()[0]}{alt}, add workers, or lower passes.examples_per_pass (or set "
            "passes.max_working_set)"
        )
        if k.certain:
            problems.append(
                f"table {part.name!r}: the largest pass stages {need:,} of its keys on one "
                f"worker but its device tier holds {rows:,} rows ({key}); {fix}"
            )
        else:
            bounds.append(
                f"table {part.name!r}: a pass stages at most {need:,} of its keys on one "
                f"worker ({_UPPER_BOUND}), and its device tier holds {rows:,} rows ({key}): "
                f"train stops at a pass with more of its keys than that; {fix}"
            )
    rows = sum(t.device.rows for t in memory.tables)
    need = keys.largest_pass_per_owner
    if keys.certain and not all(k.certain for k in per_table) and need is not None and need > rows:
        problems.append(
            f"the largest pass stages {need:,} keys on one worker but the device tiers of its "
            f"{len(names)} tables ({', '.join(names)}) hold {rows:,} rows together; raise "
            "table.tiers.device (or tables[].tiers.device), add workers, or lower "
            "passes.examples_per_pass (or set passes.max_working_set)"
        )


def _largest_part(cfg: RunConfig, memory: WorkerMemory) -> tuple[str, int, str]:
    """The part of a worker's peak that is largest and can be changed, with the config key
    that changes it (the process itself cannot)."""
    host = memory.host.total if memory.host else 0
    tiers = [
        ("the device tier", memory.device.total, f"lower {_device_key(cfg)}"),
        (
            "the host tier",
            host,
            f"lower table.tiers.host.fraction (now {cfg.table.tiers.host.fraction})",
        ),
    ]
    if len(memory.tables) > 1:  # each table's tiers, with the key that sizes them
        tiers = []
        for i, t in enumerate(memory.tables):
            device, _ = _table_device_key(cfg, i)
            host_part = t.host.total if t.host else 0
            tiers.append((f"table {t.name!r}'s device tier", t.device.total, f"lower {device}"))
            tiers.append((f"table {t.name!r}'s host tier", host_part, f"lower {_host_key(cfg, i)}"))
    parts = [
        *tiers,
        (
            "the zarr store's key index",
            memory.store + memory.store_mapped + memory.store_index,
            "add workers (cluster.n_workers), each indexes its share of the stored keys",
        ),
        (
            "the examples read and routed",
            memory.examples or 0,
            "lower passes.examples_per_pass or data.block_size",
        ),
        (
            "one evaluation batch",
            memory.eval_step,
            f"lower eval.batch_size (now {cfg.eval.batch_size})",
        ),
        (
            "one training batch",
            memory.train_step,
            "lower passes.global_batch_size or add workers",
        ),
        ("the dense model", memory.dense, "choose a smaller model.options"),
    ]
    return max(parts, key=lambda p: p[1])


def _device_key(cfg: RunConfig) -> str:
    d = cfg.table.tiers.device
    return (
        f"table.tiers.device.rows {d.rows}"
        if d.rows
        else f"table.tiers.device.fraction {d.fraction}"
    )


def _own_tiers(cfg: RunConfig, i: int) -> Any:
    """The ``tiers`` of the ``i``-th table if it is a ``tables`` entry that has them."""
    return cfg.tables[i].tiers if i < len(cfg.tables) else None


def _table_device_key(cfg: RunConfig, i: int) -> tuple[str, str]:
    """The key (with its value) that sizes the ``i``-th table's device tier, and, for a table
    that shares ``table.tiers.device``, how to give it its own."""
    own = _own_tiers(cfg, i)
    if own is not None and own.device is not None:
        d = own.device
        what = f"rows {d.rows}" if d.rows else f"fraction {d.fraction}"
        return f"tables[{i}].tiers.device.{what}", ""
    alt = f" (or give the table its own, tables[{i}].tiers.device)" if i < len(cfg.tables) else ""
    return _device_key(cfg), alt


def _host_key(cfg: RunConfig, i: int) -> str:
    own = _own_tiers(cfg, i)
    if own is not None and own.host is not None:
        return f"tables[{i}].tiers.host.fraction (now {own.host.fraction})"
    return f"table.tiers.host.fraction (now {cfg.table.tiers.host.fraction})"


def _disk(cfg: RunConfig, keys: KeyStats) -> tuple[DiskEstimate, tuple[DiskEstimate, ...]]:
    """The run's disk, and each table's stores' (none with one table: the run's are its)."""
    specs = cfg.table_specs()
    epochs = cfg.passes.epochs
    W = keys.workers
    checkpoint = getattr(cfg, "checkpoint", None)
    parts = []
    for spec, k in zip(specs, keys.by_table([s.name for s in specs]), strict=True):
        pass_rows = None if k.largest_pass_per_owner is None else k.largest_pass_per_owner * W
        written = None
        if k.pass_keys_per_owner:
            written = epochs * W * sum(k.pass_keys_per_owner)
        elif keys.passes is not None and pass_rows is not None:
            written = epochs * keys.passes * pass_rows
        parts.append(
            store_disk(
                width=spec.width,
                distinct_keys=k.distinct_keys,
                rows_written=written,
                pass_rows=pass_rows,
                checkpoint=checkpoint,
                snapshot_every=cfg.table.tiers.snapshot_every,
                dense_state_bytes=0,  # the run's, counted once below
                store_dir=cfg.table.tiers.store_dir,
            )
        )
    params = dense_param_count(cfg)
    state = 4 * params * (1 + {"sgd": 0, "adagrad": 1, "adam": 2}[cfg.dense_optimizer.kind])
    total = summed_disk(parts, checkpoints_dense_bytes(checkpoint, state))
    return total, tuple(parts) if len(parts) > 1 else ()


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_fits(cfg: RunConfig, *, resume: bool = False) -> SizingReport:
    """Size ``cfg`` from the config alone (no scan) and raise when it cannot fit; ``resume``
    as for :func:`size_run`. Logs the report's warnings, not its :attr:`~SizingReport.
    upper_bounds`: the run checks each pass exactly when it stages it.

    Raises
    ------
    CapacityError
        With :meth:`SizingReport.refusal`, the message ``daskhps plan`` prints.
    """
    report = size_run(cfg, resume=resume)
    for w in report.warnings:
        if w != MEMORY_UNKNOWN:  # train sizes the memory once connected (check_cluster_fits)
            log.warning("%s", w)
    if not report.fits:
        raise CapacityError(report.refusal())
    return report


def check_cluster_fits(
    cfg: RunConfig, *, workers: int, memory_limit: int | None, resume: bool = False
) -> SizingReport:
    """:func:`check_fits` on the ``workers`` behind ``cluster.address`` and their smallest
    ``memory_limit`` (as ``daskhps plan`` reads them), once connected: the memory warnings
    :func:`check_fits` could not give, and the refusal naming the cluster."""
    report = size_run(cfg, workers=workers, memory_limit=memory_limit, resume=resume)
    if report.memory is not None:
        said: list[str] = []  # the rest was said by check_fits, before the cluster
        _check_memory(cfg, report.keys, report.memory, [], said, [])
        for w in said:
            log.warning("%s", w)
    if not report.fits:
        raise CapacityError(
            f"{report.refusal()} (on the {workers} workers at cluster.address "
            f"{cfg.cluster.address})"
        )
    return report

"""``daskhps plan CONFIG [--set k=v] [--scan] [--json]``: size a run before it starts.

Exit status 0 when the run fits, 1 when it cannot (the reason on stderr, the same line
``daskhps train`` refuses with).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from daskhps.capacity.disk import DiskEstimate
from daskhps.capacity.fit import SizingReport, TablePlan, size_run
from daskhps.capacity.keystats import KeyStats
from daskhps.config.arguments import add_config_arguments
from daskhps.config.cluster import ClusterSecurity
from daskhps.config.runconfig import load_config
from daskhps.errors import ConfigError

__all__ = ["add_plan_arguments", "render", "run_plan"]


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument(
        "--scan",
        action="store_true",
        help="count distinct keys per worker and per pass in the training logs (reads them once)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _cluster_shape(address: str, security: ClusterSecurity | None) -> tuple[int, int | None]:
    """Workers and the smallest memory limit of a running cluster (a worker's Dask limit, or
    its memory cgroup's where that is lower: warned)."""
    from distributed import Client

    from daskhps.distributed.cgroups import worker_memory_caps
    from daskhps.distributed.cluster import dask_security, probe_scheduler

    probe_scheduler(address)
    try:
        with Client(address, timeout="10s", security=dask_security(security)) as client:
            limits = [cap.limit for cap in worker_memory_caps(client).values()]
    except OSError as e:
        raise ConfigError(
            f"cluster.address {address}: cannot reach the scheduler ({e}); start it first or "
            "plan with the embedded cluster (remove cluster.address)"
        ) from None
    if not limits:
        raise ConfigError(f"cluster.address {address}: the scheduler has no workers yet")
    return len(limits), (min(limits) or None)


def run_plan(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    workers = limit = None
    if not cfg.cluster.local:
        assert cfg.cluster.address is not None
        workers, limit = _cluster_shape(cfg.cluster.address, cfg.cluster.security)
    report = size_run(cfg, scan=args.scan, workers=workers, memory_limit=limit)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render(report))
    if not report.fits:
        print(f"daskhps plan: error: {report.refusal()}", file=sys.stderr)
        return 1
    return 0


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def _count(n: int | None) -> str:
    return "unknown" if n is None else f"{n:,}"


def _keys_lines(k: KeyStats) -> list[str]:
    how = {
        "scan": "counted in the training logs (--scan)",
        "expected": "from table.expected_keys",
        "bound": "upper bounds from the data's shape (--scan counts them)",
        "unknown": "unknown (pass --scan or set table.expected_keys)",
    }[k.source]
    return [
        f"keys: {how}",
        f"  examples {_count(k.examples)} in {_count(k.passes)} passes over {k.workers} workers",
        f"  distinct keys {_count(k.distinct_keys)}; busiest worker stores "
        f"{_count(k.keys_per_owner)}",
        f"  largest pass working set {_count(k.largest_pass_keys)}; busiest worker stages "
        f"{_count(k.largest_pass_per_owner)}",
    ]


def _tables_lines(tables: Sequence[TablePlan]) -> list[str]:
    """One line per table: what it holds, its keys, its tiers' rows and the memory and disk
    they take (the busiest worker's share; the disk of all its stores)."""
    head = (
        "table", "dim", "floats", "fields", "distinct keys", "pass keys", "device rows",
        "host rows", "memory", "disk",
    )  # fmt: skip
    body = []
    for t in tables:
        m, k = t.memory, t.keys
        body.append(
            (
                t.name,
                str(t.dim),
                str(t.width),
                str(len(t.fields)),
                _count(k.distinct_keys),
                _count(k.largest_pass_per_owner),
                "unknown" if m is None else f"{m.device.rows:,}",
                "unknown" if m is None else f"{m.host.rows if m.host else 0:,}",
                _size(None if m is None else m.total),
                _size(t.disk.stores),
            )
        )
    widths = [max(len(r[i]) for r in (head, *body)) for i in range(len(head))]

    def line(r: Sequence[str]) -> str:
        cells = [
            r[0].ljust(widths[0]),
            *(c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)),
        ]
        return "  " + "  ".join(cells).rstrip()

    return [
        "tables (pass keys and memory: the busiest worker's; disk: all its stores):",
        line(head),
        *(line(r) for r in body),
    ]


def _disk_lines(d: DiskEstimate) -> list[str]:
    """The disk block; with the distinct keys unknown (files, no --scan), why its figures are
    and what would give them (no warning: nothing is known not to fit)."""
    lines = [f"disk for the stores and checkpoints (on {d.path}, {_size(d.free)} free):"]
    if d.live is None:
        lines.append(
            "  stores not sized: their distinct keys are unknown (--scan counts them, or set "
            "table.expected_keys)"
        )
    for name, n in (
        ("live rows", d.live),
        ("older copies", d.history),
        ("snapshots", d.snapshots),
        ("compaction", d.compaction_headroom),
        ("dense ckpts", d.checkpoints_dense),
        ("total", d.total),
    ):
        lines.append(f"  {name:<12} {_size(n):>11}")
    return lines


def render(report: SizingReport) -> str:
    """The report as text, one figure per line."""
    lines = [f"plan for {report.source}", *_keys_lines(report.keys)]
    if report.tables:
        lines += _tables_lines(report.tables)
    if report.stored is not None:
        s = report.stored
        lines.append(
            f"stored table: checkpoint {s.checkpoint} holds {sum(s.rows_per_rank):,} rows; "
            f"the busiest worker opens {s.busiest:,} (train --resume)"
        )
    m = report.memory
    if m is not None:
        lines.append(f"memory per worker at its peak (limit {_size(m.memory_limit)}):")
        rows: list[tuple[str, Any, str]] = [
            ("process", m.process, "a worker that has trained once: imports, allocators")
        ]
        for name, t in (("device tier", m.device), ("host tier", m.host)):
            if t is None:
                rows.append((name, 0, "none"))
                continue
            # Several tables: each one's rows are in the tables' block.
            shape = (
                f"{t.rows:,} rows x {t.width} floats"
                if len(m.tables) < 2
                else f"{t.rows:,} rows of {len(m.tables)} tables"
            )
            rows.append(
                (
                    name,
                    t.total,
                    f"{shape}: slab {_size(t.slab)}, metadata "
                    f"{_size(t.metadata)}, index {_size(t.index)}, scratch {_size(t.scratch)}",
                )
            )
        rows.append(("zarr store", m.store, "key index and write buffer"))
        rows.append(("store maps", m.store_mapped, "segment pages read back (page cache)"))
        rows.append(("dense model", m.dense, f"{m.dense_params:,} parameters, grads, optimizer"))
        rows.append(("examples", m.examples, "training log share, two passes, holdout"))
        moments = m.transients
        which = max(moments, key=lambda k: moments[k])
        rows.append(("transient", m.transient, f"the largest: {which}"))
        for name, n, what in rows:
            lines.append(f"  {name:<12} {_size(n):>11}  {what}")
        share = f" ({m.total / m.memory_limit:.0%} of the limit)" if m.memory_limit else ""
        lines.append(f"  {'total':<12} {_size(m.total):>11}{share}")
    lines += _disk_lines(report.disk)
    # An upper bound that may not fit is the plan's to say (train checks each pass itself).
    lines += [f"warning: {w}" for w in (*report.warnings, *report.upper_bounds)]
    lines.append("fits: yes" if report.fits else "fits: NO")
    return "\n".join(lines)

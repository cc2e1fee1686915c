"""What checkpoints hold, for ``daskhps inspect PATH``: passes, days, rows per tier and shard,
sizes, metrics, versions, and whether anything is damaged. Reads only: stores are opened
read-only at each checkpoint's commit.

Every checkpoint's files are checked against its manifest (size and sha256), and every segment
and index snapshot its stores' commits read against the stores' own metadata (sizes; with
``verify`` also the sha256 recorded when each chunk file was written). Folders that are never
loaded are listed with the reason (:class:`~daskhps.runfiles.checkpoint.Skipped`).

The stores are the checkpoint's own where this machine holds them, else its copy at
``checkpoint.replicate_to`` (said in one line, and checked and verified in their place), else
it stops with one line saying where they are (:mod:`daskhps.runfiles.reading`).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from daskhps import storage
from daskhps._text import counted
from daskhps.errors import CheckpointError, DaskHPSError
from daskhps.runfiles.checkpoint import (
    MANIFEST,
    Checkpoint,
    Skipped,
    check_checkpoint,
    checkpoints_dir,
    load_checkpoint,
    model_among,
    scan_checkpoints,
)
from daskhps.runfiles.reading import stores_here
from daskhps.table.admission import PendingCounts
from daskhps.tiers.store.check import StoreChecker

__all__ = ["describe", "describe_checkpoint", "render"]

# Skipped kinds that mean damage (a killed write leaves an incomplete folder by design, and a
# newer daskhps's checkpoint is sound, only not readable here).
_DAMAGE = ("unreadable", "damaged")


def _store_rows(ckpt: Checkpoint, rank: int, table: str) -> tuple[int | None, int | None]:
    """Rows of rank ``rank``'s store of ``table`` at the checkpoint and its keys waiting for
    admission (None for a store without pending counts)."""
    try:
        with ckpt.open_store(rank, table=table) as store:
            pending = store.attached(PendingCounts.KEYS)
            return len(store), None if pending is None else len(pending)
    except (DaskHPSError, OSError):
        return None, None  # moved, deleted or damaged: the manifest still says what was there


def _bytes_when_taken(ckpt: Checkpoint, shard: dict[str, Any], table: str) -> int | None:
    """The bytes on disk of the shard's store of ``table`` when the checkpoint was taken, as
    its manifest records them; None where it does not (a shard record without its bytes, or
    a table of several in a checkpoint made before each table's were recorded).

    Not measured now: a store's folder keeps growing with the commits after this one, so
    its size today is the same for every checkpoint of the run and adds up to none of them.
    """
    if len(ckpt.table_names) > 1:
        shard = shard.get("tables", {}).get(table, {})
    value = shard.get("store_bytes")
    return None if value is None else int(value)


def _total(values: list[int | None]) -> int | None:
    """The sum, or None when any part is unknown."""
    return None if any(v is None for v in values) else sum(v or 0 for v in values)


def _rank_tables(
    ckpt: Checkpoint, stores: Checkpoint, checks: dict[str, Any], shard: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """The shard's rank's store of every table: rows, pending keys, bytes, what checking
    found."""
    rank = int(shard["rank"])
    out = {}
    for table in ckpt.table_names:
        found = checks[table][rank]
        # A damaged store is not opened: the damage says more than the error would.
        rows, pending = _store_rows(stores, rank, table) if found.ok else (None, None)
        out[table] = {
            "store_rows": rows,
            "pending_keys": pending,
            "store_bytes": _bytes_when_taken(ckpt, shard, table),
            "segments": found.segments,
            "snapshots": found.snapshots,
            "without_checksum": found.without_checksum,
            "damage": found.damage,
        }
    return out


def _shard_entry(shard: dict[str, Any], per: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A shard's record in the checkpoint, with what its rank's stores of ``per`` hold (the
    sums over tables) and each table's under ``store_tables``."""
    several = len(per) > 1
    pending = [t["pending_keys"] for t in per.values() if t["pending_keys"] is not None]
    return {
        **shard,
        "store_rows": _total([t["store_rows"] for t in per.values()]),
        "pending_keys": sum(pending) if pending else None,
        "segments": sum(t["segments"] for t in per.values()),
        "snapshots": sum(t["snapshots"] for t in per.values()),
        "without_checksum": sum(t["without_checksum"] for t in per.values()),
        "damage": [
            f"table {name}: {d}" if several else d for name, t in per.items() for d in t["damage"]
        ],
        "store_tables": per,
    }


def _table_entry(layout: dict[str, Any], shards: list[dict[str, Any]]) -> dict[str, Any]:
    """One table of the checkpoint (its ``layout``), summed over the ranks' stores."""
    name = str(layout["table"])
    parts = [sh["store_tables"][name] for sh in shards]
    pending = [p["pending_keys"] for p in parts if p["pending_keys"] is not None]
    return {
        "name": name,
        "dim": layout["dim"],
        "optimizer": layout.get("optimizer"),
        "rows": _total([p["store_rows"] for p in parts]),
        "pending_keys": sum(pending) if pending else None,
        # its share of the checkpoint's store_bytes: its stores' bytes when it was taken
        "store_bytes": _total([p["store_bytes"] for p in parts]),
    }


def _totals(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """What the checkpoint's stores hold over every shard: rows, keys waiting, bytes, checks."""
    pending = [s["pending_keys"] for s in shards]
    return {
        "rows": sum(s["store_rows"] or 0 for s in shards),
        "pending_keys": None if all(p is None for p in pending) else sum(p or 0 for p in pending),
        # the stores' folders when the checkpoint was taken: the segments of the earlier
        # commits they still held included, each segment once; what its tables' add up to
        "store_bytes": _total([s.get("store_bytes") for s in shards]),
        "segments": sum(s["segments"] for s in shards),
        "snapshots": sum(s["snapshots"] for s in shards),
        "without_checksum": sum(s["without_checksum"] for s in shards),
        "damage": [f"rank {s['rank']}: {d}" for s in shards for d in s["damage"]],
    }


def describe_checkpoint(ckpt: Checkpoint, checker: StoreChecker | None = None) -> dict[str, Any]:
    """One checkpoint as plain values (what ``inspect --json`` prints), with the damage
    ``checker`` (default: sizes only) finds in the stores it reads (every table's)."""
    checker = checker or StoreChecker()
    reading = stores_here(ckpt, checker, avoid_damage=False)
    stores = reading.require()  # its own stores, or its copy's; else one line naming both
    shards = [
        _shard_entry(s, _rank_tables(ckpt, stores, reading.checks, s))
        for s in ckpt.shards or [{"rank": r} for r in range(ckpt.num_workers)]
    ]
    table = ckpt.table
    return {
        "path": str(ckpt.path),
        "name": ckpt.name,
        "kind": ckpt.kind,
        "created": ckpt.created,
        "passes_done": ckpt.passes_done,  # = the pass number (from 1) of the last pass done
        "epoch": ckpt.epoch,
        "pass_in_epoch": ckpt.pass_in_epoch,
        "step": ckpt.step,
        "days": ckpt.days,
        "metrics": ckpt.metrics,
        "train_loss": ckpt.train_loss,
        "best": ckpt.model,  # the run's model as of this checkpoint (eval.best_by)
        "stopped": ckpt.stopped,
        "format": ckpt.format,
        "daskhps_version": ckpt.daskhps_version,
        "commit": ckpt.commit,
        "stores_dir": str(ckpt.stores_dir),
        # the stores read, when they are its copy's: they are not on this machine
        "read_from_copy": (
            {
                "checkpoint": str(stores.path),
                "stores_dir": str(stores.stores_dir),
                "commit": stores.commit,
                "why": reading.why,
            }
            if reading.from_copy
            else None
        ),
        "num_workers": ckpt.num_workers,
        "num_shards": ckpt.num_shards,
        "table": {
            "name": table["table"],
            "dim": table["dim"],
            "optimizer": table.get("optimizer"),
        },
        # every table (one: the run's table): its rows and bytes when taken
        "tables": [_table_entry(layout, shards) for layout in ckpt.tables or [table]],
        "model": ckpt.run_config.get("model", {}).get("name"),
        "files": {k: v["size"] for k, v in ckpt.files.items()},
        "seconds": ckpt.seconds,
        "shards": shards,
        "lifecycle": dict(ckpt.lifecycle),
        "verified": checker.verify,
        **_totals(shards),  # damage last
    }


def _skipped(s: Skipped) -> dict[str, Any]:
    return {"name": s.name, "path": str(s.path), "kind": s.kind, "reason": s.reason}


def _growth(described: list[dict[str, Any]]) -> None:
    """Note in each checkpoint of a run how much more (or less) its stores held than at the
    one before (``store_bytes_since``); None for the first, or where either is unknown."""
    for d in described:
        d["store_bytes_added"] = d["store_bytes_since"] = None
    for before, d in itertools.pairwise(described):
        if None not in (before["store_bytes"], d["store_bytes"]):
            d["store_bytes_added"] = d["store_bytes"] - before["store_bytes"]
            d["store_bytes_since"] = before["name"]


def describe(path: str | os.PathLike[str], *, verify: bool = False) -> dict[str, Any]:
    """A checkpoint folder (that one) or a run directory (every checkpoint, oldest first,
    and the folders never loaded, with the reason). ``verify`` recomputes the sha256 of every
    store chunk file that has one recorded (reads every byte); by default sizes are checked.

    ``damaged`` is true when any checkpoint's files or stores are damaged (what makes
    ``daskhps inspect`` exit non-zero); ``damage`` lists each problem on one line.
    """
    if storage.is_url(str(path)):  # a copy in object storage: its checkpoint, cached here
        from daskhps.runfiles.copycache import fetched_model

        path = fetched_model(str(path))[0]
    p = Path(path)
    checker = StoreChecker(verify=verify)
    folder = checkpoints_dir(p)
    if folder.is_dir() and not (p / MANIFEST).exists():
        found, skipped = scan_checkpoints(p)
        if not found and not skipped:
            raise CheckpointError(f"{folder} holds no checkpoint")
        described = [describe_checkpoint(c, checker) for c in found]
        _growth(described)
        run_dir: str | None = str(p)
        model = model_among(found)
        for d in described:  # the one predict, serve and export take from the run
            d["run_model"] = model is not None and d["name"] == model.name
    else:
        # One checkpoint folder: a damaged or incomplete one is described, not refused.
        in_run = p.is_dir() and p.parent.name == "checkpoints"
        one = check_checkpoint(p) if (p / MANIFEST).exists() or in_run else load_checkpoint(p)
        if isinstance(one, Skipped) and one.kind == "newer":
            load_checkpoint(p)  # raises the upgrade message: nothing here to describe
        found, skipped = ([one], []) if isinstance(one, Checkpoint) else ([], [one])
        described = [describe_checkpoint(c, checker) for c in found]
        run_dir = None
    damage = [f"{d['name']}: {line}" for d in described for line in d["damage"]]
    damage += [f"{s.name}: {s.reason}" for s in skipped if s.kind in _DAMAGE]
    return {
        "run_dir": run_dir,
        "checkpoints": described,
        "skipped": [_skipped(s) for s in skipped],
        "incomplete": [s.name for s in skipped if s.kind == "incomplete"],
        "verified": verify,
        "damaged": bool(damage),
        "damage": damage,
    }


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _checked(c: dict[str, Any]) -> str:
    text = f"  checked {c['segments']} store segment(s)"
    if c["snapshots"]:
        text += f" and {c['snapshots']} index snapshot(s)"
    text += ": sizes and sha256" if c["verified"] else ": sizes (sha256 too with --verify)"
    if c["without_checksum"]:
        text += (
            f"; {c['without_checksum']} of them have no checksum (written before daskhps "
            "recorded them)" + (": sizes only" if c["verified"] else "")
        )
    return text


def _table_line(t: dict[str, Any]) -> str:
    """One table of a checkpoint with several: its layout, rows and bytes."""
    rows = "rows unknown" if t["rows"] is None else f"{t['rows']:,} rows"
    if t.get("pending_keys") is not None:
        rows += f" ({t['pending_keys']:,} more keys seen, not admitted yet)"
    if t["store_bytes"] is not None:  # its part of the checkpoint's bytes on disk
        rows += f", {_size(t['store_bytes'])} on disk when taken"
    return f"table {t['name']} dim {t['dim']} ({t['optimizer']}): {rows}"


def _loss(loss: float | None) -> str:
    """Five significant digits: what tells two checkpoints' losses apart (a float's last
    digits are noise; ``--json`` keeps them all)."""
    return "-" if loss is None else f"{loss:.5g}"


def _header_lines(c: dict[str, Any]) -> list[str]:
    """A checkpoint's position, versions, layout, metrics and files."""
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in c["metrics"].items() if k != "examples")
    days = c["days"]
    day_text = f"{days[0]}..{days[-1]}" if len(days) > 1 else (days[0] if days else "-")
    # pass-000004 is taken after pass 4 (passes count from 1 over the run, as in
    # metrics.jsonl); checkpoints before pass_in_epoch was recorded counted epochs from 0
    epoch = f" (epoch {c['epoch']})" if c.get("pass_in_epoch") is not None else ""
    return [
        f"{c['name']} ({c['kind']}, {c['created']}): after pass {c['passes_done']}{epoch}, "
        f"step {c['step']}, days {day_text}",
        f"  daskhps {c['daskhps_version']}, format {c['format']}; model {c['model']}, "
        + (
            f"table {c['table']['name']} dim {c['table']['dim']} ({c['table']['optimizer']})"
            if len(c.get("tables") or []) <= 1
            else f"{len(c['tables'])} tables"
        )
        + f", {counted(c['num_shards'], 'shard')} on {counted(c['num_workers'], 'worker')}",
        f"  metrics: {metrics or '-'}; train loss {_loss(c['train_loss'])}",
        *_model_lines(c),
        "  files: "
        + ", ".join(f"{k} {_size(v)}" for k, v in c["files"].items())
        + (f"; written in {c['seconds']:.2f} s" if c.get("seconds") is not None else ""),
    ]


def _model_lines(c: dict[str, Any]) -> list[str]:
    """Whether the checkpoint is the run's model, what it names as the best, and why the
    run stopped after it."""
    lines = []
    if c.get("run_model"):
        lines.append("  the run's model: predict, serve and export take this checkpoint")
    best = c.get("best")
    if best and best.get("checkpoint") != c["name"]:
        lines.append(f"  best so far: {best['checkpoint']} ({best['metric']} {best['value']:.4f})")
    stopped = c.get("stopped")
    if stopped:
        lines.append(f"  the run stopped here ({stopped['kind']}): {stopped['why']}")
    return lines


def _store_bytes(c: dict[str, Any]) -> str:
    """The stores' bytes when the checkpoint was taken (what its tables' lines add up to),
    and how much more or less than at the checkpoint before."""
    if c["store_bytes"] is None:
        return ""  # not recorded by the daskhps that took it
    text = f", {_size(c['store_bytes'])} on disk when taken"
    added = c.get("store_bytes_added")
    if added is not None:
        text += f" ({_size(abs(added))} {'more' if added >= 0 else 'less'} than "
        text += f"{c['store_bytes_since']})"
    return text


def _store_lines(c: dict[str, Any]) -> list[str]:
    """A checkpoint's stores: rows and bytes, in all, per table, per day and per rank."""
    unread = any(s["store_rows"] is None for s in c["shards"])
    rows = "rows unknown" if unread else f"{c['rows']:,} rows"
    if c.get("pending_keys") is not None:
        rows += f" ({c['pending_keys']:,} more keys seen, not admitted yet)"
    copy = c.get("read_from_copy")
    lines = [f"  stores {(copy or c)['stores_dir']} at commit {(copy or c)['commit']}: {rows}"]
    lines[0] += _store_bytes(c)
    if copy:
        lines.append(f"  stores: read from the copy at {copy['checkpoint']}: {copy['why']}")
    if len(c.get("tables") or []) > 1:
        lines += [f"  {_table_line(t)}" for t in c["tables"]]
    if c.get("lifecycle"):
        lines.append(
            "  keys admitted / rows expired per day: "
            + ", ".join(
                f"{day} +{v['admitted']:,} / -{v['expired']:,}"
                for day, v in sorted(c["lifecycle"].items())
            )
        )
    for s in c["shards"]:
        if s["store_rows"] is not None:
            store = f"{s['store_rows']:,} rows"
        else:
            store = "damaged" if s["damage"] else "unreadable"
        lines.append(
            f"    rank {s['rank']}: store {store}, device {s.get('device_rows', '?')}"
            f", host {s.get('host_rows', '?')} rows resident when taken"
        )
    return lines


def _damage_lines(info: dict[str, Any]) -> list[str]:
    """The folders never loaded, and what to do about the damaged ones."""
    lines = [
        f"{s['name']}: {s['kind']}, never loaded: {s['reason']}" for s in info.get("skipped", [])
    ]
    files = [s["name"] for s in info.get("skipped", []) if s["kind"] in _DAMAGE]
    stores = [c["name"] for c in info["checkpoints"] if c["damage"]]
    if files:
        lines.append(
            f"damaged checkpoint files: {', '.join(files)}: never loaded (resume and predict "
            "take the newest intact checkpoint)"
        )
    if stores:
        lines.append(
            f"damaged stores: {', '.join(stores)}: resuming or scoring from these fails; pick "
            "an intact checkpoint (--checkpoint NAME) or restore the stores from a backup"
        )
    return lines


def render(info: dict[str, Any]) -> str:
    """Human-readable lines of :func:`describe`'s result."""
    lines = []
    if info.get("run_dir"):
        skipped = f", {len(info['skipped'])} never loaded" if info.get("skipped") else ""
        lines.append(f"run {info['run_dir']}: {len(info['checkpoints'])} checkpoint(s){skipped}")
    for c in info["checkpoints"]:
        lines += _header_lines(c) + _store_lines(c) + [_checked(c)]
        lines += [f"  DAMAGED {d}" for d in c["damage"]]
    lines += _damage_lines(info)
    return "\n".join(lines)

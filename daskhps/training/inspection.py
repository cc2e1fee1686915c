"""What checkpoints hold, for ``daskhps inspect PATH``: passes, days, rows per tier and shard,
sizes, metrics, versions. Reads only: stores are opened read-only at each checkpoint's commit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from daskhps.errors import CheckpointError, DaskHPSError
from daskhps.tiers.zarr_store import ZarrStore
from daskhps.training.checkpoint import (
    MANIFEST,
    Checkpoint,
    checkpoints_dir,
    list_checkpoints,
    load_checkpoint,
)

__all__ = ["describe", "describe_checkpoint", "render"]


def _store_rows(ckpt: Checkpoint, rank: int) -> int | None:
    spec = ckpt.manifest["table"]
    try:
        with ZarrStore.open(
            ckpt.store_path(rank),
            name=f"{spec['table']}/zarr",
            width=int(spec["width"]),
            layout=spec,
            mode="r",
            commit=ckpt.commit,
        ) as store:
            return len(store)
    except (DaskHPSError, OSError):
        return None  # stores moved or deleted: the manifest still says what was there


def describe_checkpoint(ckpt: Checkpoint) -> dict[str, Any]:
    """One checkpoint as plain values (what ``inspect --json`` prints)."""
    m = ckpt.manifest
    shards = []
    for s in m.get("shards") or [{"rank": r} for r in range(ckpt.num_workers)]:
        shards.append({**s, "store_rows": _store_rows(ckpt, int(s["rank"]))})
    table = m["table"]
    return {
        "path": str(ckpt.path),
        "name": ckpt.name,
        "kind": ckpt.kind,
        "created": m.get("created"),
        "passes_done": ckpt.passes_done,  # = the pass number (from 1) of the last pass done
        "epoch": m.get("epoch"),
        "pass_in_epoch": m.get("pass_in_epoch"),
        "step": ckpt.step,
        "days": m.get("days", []),
        "metrics": ckpt.metrics,
        "train_loss": m.get("train_loss"),
        "format": m["format"],
        "daskhps_version": m.get("daskhps_version"),
        "commit": ckpt.commit,
        "stores_dir": str(ckpt.stores_dir),
        "num_workers": ckpt.num_workers,
        "num_shards": ckpt.num_shards,
        "table": {
            "name": table["table"],
            "dim": table["dim"],
            "optimizer": table.get("optimizer"),
        },
        "model": m["config"].get("model", {}).get("name"),
        "files": {k: v["size"] for k, v in m["files"].items()},
        "seconds": m.get("seconds"),
        "shards": shards,
        "rows": sum(s["store_rows"] or 0 for s in shards),
        "store_bytes": sum(int(s.get("store_bytes", 0)) for s in shards),
    }


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint folder (that one) or a run directory (every checkpoint, oldest first,
    and the folders of unfinished ones, which are never loaded)."""
    p = Path(path)
    folder = checkpoints_dir(p)
    if folder.is_dir() and not (p / MANIFEST).exists():
        found = list_checkpoints(p)
        complete = {c.path.name for c in found}
        torn = sorted(e.name for e in folder.iterdir() if e.is_dir() and e.name not in complete)
        if not found and not torn:
            raise CheckpointError(f"{folder} holds no checkpoint")
        described = [describe_checkpoint(c) for c in found]
        prev = 0
        for d in described:  # how much each checkpoint added to the stores
            d["store_bytes_added"] = d["store_bytes"] - prev
            prev = d["store_bytes"]
        return {"run_dir": str(p), "checkpoints": described, "incomplete": torn}
    return {"run_dir": None, "checkpoints": [describe_checkpoint(load_checkpoint(p))]}


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def render(info: dict[str, Any]) -> str:
    """Human-readable lines of :func:`describe`'s result."""
    lines = []
    if info.get("run_dir"):
        lines.append(f"run {info['run_dir']}: {len(info['checkpoints'])} checkpoint(s)")
    for c in info["checkpoints"]:
        metrics = ", ".join(f"{k} {v:.4f}" for k, v in c["metrics"].items() if k != "examples")
        days = c["days"]
        day_text = f"{days[0]}..{days[-1]}" if len(days) > 1 else (days[0] if days else "-")
        # pass-000004 is taken after pass 4 (passes count from 1 over the run, as in
        # metrics.jsonl); checkpoints before pass_in_epoch was recorded counted epochs from 0
        epoch = f" (epoch {c['epoch']})" if c.get("pass_in_epoch") is not None else ""
        lines += [
            f"{c['name']} ({c['kind']}, {c['created']}): after pass {c['passes_done']}{epoch}, "
            f"step {c['step']}, days {day_text}",
            f"  daskhps {c['daskhps_version']}, format {c['format']}; model {c['model']}, "
            f"table {c['table']['name']} dim {c['table']['dim']} ({c['table']['optimizer']}), "
            f"{c['num_shards']} shards on {c['num_workers']} workers",
            f"  metrics: {metrics or '-'}; train loss {c['train_loss']}",
            "  files: "
            + ", ".join(f"{k} {_size(v)}" for k, v in c["files"].items())
            + (f"; written in {c['seconds']:.2f} s" if c.get("seconds") is not None else ""),
        ]
        added = c.get("store_bytes_added")
        lines.append(
            f"  stores {c['stores_dir']} at commit {c['commit']}: {c['rows']:,} rows, "
            f"{_size(c['store_bytes'])} on disk"
            + (f" ({_size(added)} added)" if added is not None else "")
        )
        for s in c["shards"]:
            store = "missing" if s["store_rows"] is None else f"{s['store_rows']:,}"
            lines.append(
                f"    rank {s['rank']}: store {store} rows, device {s.get('device_rows', '?')}"
                f", host {s.get('host_rows', '?')} rows resident when taken"
            )
    for name in info.get("incomplete", []):
        lines.append(f"{name}: incomplete (no valid {MANIFEST}; never loaded)")
    return "\n".join(lines)

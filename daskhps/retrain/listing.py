"""What a retraining folder published, as ``daskhps retrain --versions`` and ``daskhps inspect``
show it: every version with what it trained on (days, or a follower's chunk), what it was
scored on and how it scored, and the recent attempts that published nothing, with why."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from daskhps.retrain.versions import Attempt, Registry, Version

__all__ = ["describe_registry", "registry_json"]

_SHOWN_ATTEMPTS = 5


def _trained_on(v: Version | Attempt) -> str:
    """A follower's chunk (its name, and its file count when several), or the days."""
    if v.chunk is not None:
        many = f" ({len(v.files)} files)" if len(v.files) > 1 else ""
        return f"{Path(v.chunk).name}{many}"
    return ", ".join(v.train_days) or "-"


def _scored_on(v: Version | Attempt) -> str:
    return "its chunk, first" if v.chunk is not None else v.eval_day


def _metric(m: dict[str, float], key: str) -> str:
    value = m.get(key, math.nan)
    return f"{value:.5f}" if math.isfinite(value) else "-"


def describe_registry(registry: Registry) -> str:
    """The published versions (``*``: CURRENT) and the recent attempts not published."""
    current = registry.current()
    removed = registry.removed_names()
    rows = [("", "version", "parent", "trained on", "scored on", "auc", "logloss", "created")]
    for v in registry.versions():
        if v.name in removed:
            continue  # keep_versions removed it: nothing of it is left to serve
        # a follower's version is scored on its chunk before training (progressive):
        # its baseline is what the version's parent scored there, which is what users read
        shown = v.baseline if v.chunk is not None else v.metrics
        rows.append(
            (
                "*" if current and v.name == current.name else "",
                v.name,
                v.parent or "-",
                _trained_on(v),
                _scored_on(v),
                _metric(shown, "auc"),
                _metric(shown, "logloss"),
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v.created)),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if len(rows) == 1:
        lines.append("   (none published)")
    if any(v.chunk is not None for v in registry.versions()):
        lines.append(
            "   a follower's version is scored on its chunk by its parent, before training "
            "on it (progressive validation)"
        )
    if removed:
        lines.append(f"   removed by retrain.keep_versions: {', '.join(sorted(removed))}")
    unpublished = [a for a in registry.attempts() if a.outcome != "published"]
    if unpublished:
        lines.append("recent attempts not published:")
        for a in unpublished[-_SHOWN_ATTEMPTS:]:
            what = f"on {_trained_on(a)}" if a.chunk is not None else f"scored on {a.eval_day}"
            lines.append(f"   {a.id} {a.outcome} {what}: {'; '.join(a.reasons)}")
        if len(unpublished) > _SHOWN_ATTEMPTS:
            lines.append(
                f"   ({len(unpublished) - _SHOWN_ATTEMPTS} earlier ones in {registry.path})"
            )
    return "\n".join(lines)


def registry_json(registry: Registry) -> dict[str, Any]:
    """The same, for ``daskhps inspect --json``: every version and attempt as recorded."""
    current = registry.current()
    removed = registry.removed_names()
    return {
        "registry": str(registry.path),
        "current": current.name if current else None,
        "versions": [{**v.to_dict(), "removed": v.name in removed} for v in registry.versions()],
        "attempts": [a.to_dict() for a in registry.attempts()],
    }

"""``MANIFEST.json`` of a checkpoint, field by field: the one declaration of what it records.

The trainer's checkpointer, ``daskhps import`` and publishing write it through
``finish_checkpoint``, which checks it against this declaration (:meth:`json_fields`) before
the file is written, so a missing field fails before anything is visible; loading checks it
the same way; everyone else reads typed attributes of the
:class:`~daskhps.runfiles.checkpoint.Checkpoint`, which is a manifest with its folder.
Keys this daskhps does not know (a published version's ``version`` and ``trained_as``) are
kept in :attr:`CheckpointManifest.extra` and written back unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "CheckpointManifest", "ManifestError"]

# 2: a run with several tables (``tables``); a run with one table still writes 1, which
# every daskhps reads.
FORMAT = 2

# Fields whose JSON key is not their name ("config" is the RunConfig a Checkpoint builds).
_KEYS = {"run_config": "config"}
# Written for people reading the file (the pass numbers of metrics.jsonl), derived on load.
_DERIVED = ("pass",)


class ManifestError(ValueError):
    """A manifest that lacks fields (the message lists them)."""


@dataclass(frozen=True, kw_only=True)
class CheckpointManifest:
    """What one checkpoint records (see docs/checkpoints.md for the folder around it)."""

    format: int
    name: str
    kind: str  # "base" (stores compacted, full index snapshot) or "delta"
    passes_done: int
    step: int  # optimizer steps taken (the LR schedule's position)
    commit: str  # every rank store's commit point holding the table's rows
    stores_dir: Path
    num_workers: int
    num_shards: int
    table: dict[str, Any]  # the stores' layout (TableSpec.layout()); the first table's
    run_config: dict[str, Any]  # key "config": the run's config as a dict
    files: dict[str, dict[str, Any]]  # file name -> {"size", "sha256"}
    daskhps_version: str | None = None
    created: str | None = None
    epoch: int | None = None
    pass_in_epoch: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)  # the last pass's evaluation
    train_loss: float | None = None
    days: list[str] = field(default_factory=list)
    plan: dict[str, Any] | None = None  # identifies the plan's input; a resume checks it
    shards: list[dict[str, Any]] = field(default_factory=list)  # per rank: tier rows, bytes
    seconds: float | None = None  # to write it, all but the manifest
    # per log day of the run so far: keys admitted and rows expired (table.admission, .expiry)
    lifecycle: dict[str, dict[str, int]] = field(default_factory=dict)
    # several tables: every table's layout, in index order (empty with one table: ``table``)
    tables: list[dict[str, Any]] = field(default_factory=list)
    # the run's model as of this checkpoint (eval.best_by): {"checkpoint", "metric", "value",
    # "passes_done"}; None: the latest checkpoint is (daskhps.training.watch.Best)
    model: dict[str, Any] | None = None
    # the run stopped after this checkpoint's pass before its schedule ended (early, by
    # eval.patience): {"kind", "passes_done", "why"} (daskhps.training.watch.Stop)
    stopped: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def required_keys(cls) -> list[str]:
        return [
            _KEYS.get(f.name, f.name)
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]

    @classmethod
    def json_fields(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of ``cls`` (or a subclass) for the manifest ``data``.

        Raises :class:`ManifestError` naming the required keys it lacks."""
        if not isinstance(data, dict):
            raise ManifestError(f"the manifest is a {type(data).__name__}, not an object")
        missing = [k for k in CheckpointManifest.required_keys() if k not in data]
        if missing:
            raise ManifestError(f"lacks {missing}")
        kwargs: dict[str, Any] = {"extra": {}}
        known = {_KEYS.get(f.name, f.name): f.name for f in dataclasses.fields(CheckpointManifest)}
        for key, value in data.items():
            if key in _DERIVED:
                continue
            name = known.get(key)
            if name is None or name == "extra":
                kwargs["extra"][key] = value
            else:
                kwargs[name] = value
        kwargs["stores_dir"] = Path(kwargs["stores_dir"])
        kwargs["metrics"] = dict(kwargs.get("metrics") or {})
        return kwargs

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(CheckpointManifest):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if f.name in ("tables", "model", "stopped") and not value:
                continue  # one table: the manifest of format 1, unchanged; none: unsaid
            out[_KEYS.get(f.name, f.name)] = str(value) if isinstance(value, Path) else value
            if f.name == "passes_done":
                out["pass"] = value
        out.update(self.extra)
        return out

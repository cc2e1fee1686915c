"""Which config keys may change between a checkpoint and the run that continues from it.

Two runs continue from a checkpoint: a *resume* (``daskhps train --resume``) replays the rest
of the same plan into the same stored rows; a *warm start* (a retraining candidate, see
:mod:`daskhps.retrain.candidate`) trains new days from a published version. Both compare the
checkpoint's config with the new one leaf by leaf, and both read :data:`POLICY`, the one
declaration of what each accepts and why (docs/checkpoints.md, "What may change when a run
continues", renders it).

A policy entry names a node of the config tree (``table.optimizer.lr``) and covers every key
under it (``cluster`` covers ``cluster.n_workers``); the longest entry that covers a key
decides. A key inside a list of mappings names its item (``tables[1].dim``) and is decided by
the entry without the index (``tables.dim``). A key no entry covers is refused by both modes:
a new config key must be classified here before either mode lets it change.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, NamedTuple

from daskhps.config import RunConfig
from daskhps.errors import ConfigError, ResumeError

__all__ = ["POLICY", "Mode", "Rule", "check_changes", "config_changes", "rule"]

Mode = Literal["resume", "warm_start"]


class Rule(NamedTuple):
    """Whether each mode accepts a change under ``key``, and why."""

    key: str
    resume: bool
    warm_start: bool
    why: str


_ROWS = "what a stored row means"
_MODEL = "the dense model's shape"
_PLAN = "the plan a resume replays (a warm start trains a new plan)"
_SPEED = "speed, placement or reporting only"
_ADMISSION = (
    "which keys get rows in the passes a resume replays; a warm start admits by the new "
    "rule from its first pass, the pending counts carried on"
)
_EXPIRY = (
    "which rows leave the table in the passes a resume replays; a warm start expires by "
    "the new rule from its first day boundary"
)


def _table_rules(section: str) -> tuple[Rule, ...]:
    """One table's rules, for ``table`` and each entry of ``tables`` alike."""
    optimizer = "settings of the stored optimizer state a resume continues"
    return tuple(
        Rule(f"{section}.{key}", resume, warm_start, why)
        for key, resume, warm_start, why in (
            ("name", False, False, _ROWS),
            ("dim", False, False, _ROWS),
            ("seed", False, False, "a new row's initial values: " + _ROWS),
            ("init_scale", False, False, "a new row's initial values: " + _ROWS),
            ("optimizer", False, True, optimizer),
            ("optimizer.kind", False, False, "what the stored optimizer state means"),
            ("optimizer.row_wise", False, False, "the stored optimizer state's shape"),
            ("optimizer.lr", True, True, "a learning rate may be tuned"),
            ("admission", False, True, _ADMISSION),
            ("expiry", False, True, _EXPIRY),
            ("tiers", True, True, _SPEED),
        )
    )


POLICY: tuple[Rule, ...] = (
    Rule("run.name", True, True, "a label"),
    Rule("run.dir", True, True, "where the run writes; a candidate runs in its attempt's"),
    Rule("run.quiet", True, True, "reporting only"),
    Rule("run.seed", False, True, _PLAN),
    Rule("data", False, True, _PLAN),
    Rule("data.generate.workers", True, True, "how many processes write the logs"),
    Rule("data.schema", False, False, "which columns are keys: " + _ROWS),
    Rule("passes", False, True, _PLAN),
    Rule("passes.epochs", True, True, "may grow: more passes are appended to the plan"),
    Rule("passes.shuffle_method", True, True, "how the plan's shuffle is computed, not what"),
    Rule("passes.num_shards", False, False, "which worker owns a key (the stores' layout)"),
    *_table_rules("table"),
    Rule("table.expected_keys", False, True, "sizes the stores a resume reopens"),
    # Adding or removing a listed table changes its name and features, and moves fields
    # between tables.
    Rule("tables", False, False, "which table holds a field: " + _ROWS),
    *_table_rules("tables"),
    Rule("tables.features", False, False, "which fields' keys a table holds: " + _ROWS),
    Rule(
        "tables.shared_keys",
        False,
        False,
        "whether two features' equal values are one row: " + _ROWS,
    ),
    Rule("model", False, False, _MODEL),
    Rule("dense_optimizer.kind", False, False, "what the stored optimizer state means"),
    Rule("dense_optimizer.lr", True, True, "a learning rate may be tuned"),
    Rule("dense_optimizer.weight_decay", True, True, "may be tuned"),
    Rule("dense_optimizer.grad_clip_norm", True, True, "may be tuned"),
    Rule("dense_optimizer.schedule", False, True, "a resume continues the schedule's steps"),
    Rule("dense_optimizer.warmup_steps", False, True, "a resume continues the schedule's steps"),
    Rule("cluster", True, True, _SPEED + " (another worker count re-shards)"),
    Rule("eval", True, True, _SPEED),
    Rule("checkpoint", True, True, _SPEED),
    Rule("retrain", False, True, "the guard of a retraining run, not of a resumed one"),
)
_BY_KEY = {r.key: r for r in POLICY}
_INDEX = re.compile(r"\[\d+\]")


def rule(key: str) -> Rule | None:
    """The entry that decides ``key`` (the longest that covers it); None when none does."""
    parts = _INDEX.sub("", key).split(".")
    for n in range(len(parts), 0, -1):
        found = _BY_KEY.get(".".join(parts[:n]))
        if found is not None:
            return found
    return None


def _accepts(key: str, mode: Mode) -> bool:
    r = rule(key)
    return r is not None and (r.resume if mode == "resume" else r.warm_start)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    # A list of mappings (the tables) is compared item by item: its keys are decided one by
    # one, and an item added or removed shows as its keys from or to None.
    if isinstance(d, list) and d and all(isinstance(v, dict) for v in d):
        out: dict[str, Any] = {}
        for i, v in enumerate(d):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out
    if not isinstance(d, dict):
        return {prefix: d}
    out = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_changes(old: RunConfig, new: RunConfig) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (checkpoint's value, new value)}`` of every leaf that differs."""
    a, b = _flatten(old.to_dict()), _flatten(new.to_dict())
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def _said(key: str, old: Any, new: Any, config: RunConfig) -> str:
    """``key: old -> new`` and where ``config`` (the continuing run's) writes the new value:
    the line or ``--set`` to change back (``from table.dim`` where the key takes another's
    value), or that its file leaves it out."""
    at, where = config.origins.origin(key)
    via = "" if at == key else f" (from {at})"
    place = f" at {where}" if where is not None else f", not in {config.source}"
    return f"{key}: {old!r} -> {new!r}{place}{via}"


def check_changes(
    old: RunConfig, new: RunConfig, mode: Mode, source: str | Path
) -> dict[str, tuple[Any, Any]]:
    """The changes from ``old`` (the config of the checkpoint at ``source``) to ``new`` when
    ``mode`` accepts them all; otherwise one error listing every refused key with both
    values (:class:`ResumeError` for a resume, :class:`ConfigError` for a warm start)."""
    changes = config_changes(old, new)
    refused = {k: v for k, v in changes.items() if not _accepts(k, mode)}
    if not refused:
        return changes
    listed = "; ".join(_said(k, a, b, new) for k, (a, b) in refused.items())
    if mode == "resume":
        raise ResumeError(
            f"cannot resume from {source}: the config changed where a resume must not "
            f"({listed}); these decide the plan or the meaning of the stored rows. Put the "
            "checkpoint's values back to resume, or start a new run (without --resume, or "
            "with another run.dir)"
        )
    raise ConfigError(
        f"{new.source}: cannot train from {source}: the config changed what its "
        f"stored rows or dense model mean ({listed}); put the published values back, or "
        "start a new lineage in another run.dir"
    )

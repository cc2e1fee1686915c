"""Resuming a run: which config changes a resume accepts, and re-sharding the table stores
(every table's) when the number of workers changed.

A resume replays the rest of the plan from a checkpoint, so whatever decides the plan or the
meaning of the stored rows must not change; what only decides speed or reporting may, and so
may the learning rates. The keys and reasons are :data:`daskhps.training.changes.POLICY`,
shared with the warm start of a retraining candidate.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from daskhps._text import counted
from daskhps.config import RunConfig
from daskhps.errors import ResumeError
from daskhps.runfiles.checkpoint import Checkpoint
from daskhps.runfiles.rundir import published_commits
from daskhps.sharding import ShardMap
from daskhps.table import open_shard_store
from daskhps.table.admission import PendingCounts
from daskhps.tiers.lock import WriterLock
from daskhps.training.changes import check_changes
from daskhps.training.records import RunResult

__all__ = [
    "check_plan",
    "check_resume",
    "plan_fingerprint",
    "reshard",
    "resharded_dir",
    "restore_metrics",
    "stores_owner",
    "stores_to_train_in",
]

log = logging.getLogger(__name__)

_ROWS_PER_READ = 1 << 20


def check_resume(ckpt: Checkpoint, new: RunConfig) -> dict[str, tuple[Any, Any]]:
    """The accepted changes from ``ckpt``'s config to ``new``; :class:`ResumeError` naming
    every refused one (and what would fix it) otherwise (see :mod:`daskhps.training.changes`)."""
    return check_changes(ckpt.config, new, "resume", ckpt.path)


def reshard(ckpt: Checkpoint, num_workers: int, out_dir: Path) -> Path:
    """Write the rows of ``ckpt``'s stores, every table's, into ``num_workers`` new rank
    stores per table under ``out_dir`` (``<out_dir>/<table>/rank-<j>``), each committed as
    ``ckpt.commit``; returns ``out_dir``.

    Every old rank store is read read-only at the checkpoint's commit, in blocks of rows;
    each row goes to the new owner of its key (``ShardMap(num_shards, num_workers)`` of the
    full key, table bits included, as in training), and so does each pending count of a key
    not admitted yet (the arrays the commit carries). The old stores are not touched.
    """
    versions = published_commits(out_dir)
    if versions:  # the re-shard below replaces the stores there: never a published version's
        raise ResumeError(
            f"cannot re-shard {ckpt.name} into {out_dir}: its stores hold published versions "
            f"({', '.join(versions)}); resume on {counted(ckpt.num_workers, 'worker')} instead"
        )
    deadline = time.monotonic() + 30.0
    for table in ckpt.table_names:
        for old in sorted((out_dir / table).glob("rank-*")):  # an earlier, killed re-shard's
            _wait_unlocked(old, f"re-sharded store {table}/{old.name}", deadline, 30.0)
    moved = sum(_reshard_table(ckpt, table, num_workers, out_dir) for table in ckpt.table_names)
    log.info(
        "re-sharded %d rows of %s from %d to %d workers into %s",
        *(moved, ckpt.name, ckpt.num_workers, num_workers, out_dir),
    )
    return out_dir


def _reshard_table(ckpt: Checkpoint, table: str, num_workers: int, out_dir: Path) -> int:
    """:func:`reshard` of one table's stores; the rows moved."""
    spec = ckpt.spec_of(table)
    new_map = ShardMap(ckpt.num_shards, num_workers)
    dst = [
        open_shard_store(spec, out_dir / table / f"rank-{r}", mode="w", overwrite=True)
        for r in range(num_workers)
    ]
    moved = 0
    pending: list[list[PendingCounts]] = [[] for _ in range(num_workers)]
    carried = False
    try:
        for r in range(ckpt.num_workers):
            with ckpt.open_store(r, table=table) as src:
                carried |= bool(src.attached_names)
                counts = PendingCounts.from_arrays(
                    src.attached(PendingCounts.KEYS), src.attached(PendingCounts.STATS)
                )
                owner_of_pending = new_map.worker(counts.keys)
                for w in range(num_workers):
                    sel = owner_of_pending == w
                    pending[w].append(PendingCounts(counts.keys[sel], counts.stats[sel]))
                keys = src.keys()
                for a in range(0, int(keys.shape[0]), _ROWS_PER_READ):
                    part = keys[a : a + _ROWS_PER_READ]
                    rows = src.lookup(part).rows
                    owner = new_map.worker(part)
                    for w in range(num_workers):
                        sel = owner == w
                        if bool(sel.any()):
                            dst[w].upsert(part[sel], rows[sel])
                    moved += int(part.shape[0])
        for d, parts in zip(dst, pending, strict=True):
            attach = PendingCounts.merged(parts).arrays() if carried else None
            meta = {"checkpoint": ckpt.commit, "resharded_from": ckpt.num_workers}
            d.commit(ckpt.commit, meta, attach)
    finally:
        for d in dst:
            d.close()
    return moved


# -- the trainer's resume steps ------------------------------------------------------------


def scheduled_passes(ckpt: Checkpoint, config: RunConfig) -> int | None:
    """Passes ``config`` schedules on the plan ``ckpt`` was taken in (its passes per epoch
    times ``passes.epochs``); None for a checkpoint that predates plan records."""
    per_epoch = (ckpt.plan or {}).get("passes")
    return None if per_epoch is None else int(per_epoch) * config.passes.epochs


def check_epochs(ckpt: Checkpoint, config: RunConfig) -> None:
    """:class:`ResumeError`, before any cluster starts, when ``config`` schedules fewer passes
    than ``ckpt`` has done (``passes.epochs`` lowered)."""
    total = scheduled_passes(ckpt, config)
    if total is not None and ckpt.passes_done > total:
        raise ResumeError(
            f"cannot resume from {ckpt.path}: it is {counted(ckpt.passes_done, 'pass', 'passes')} "
            "in, but the "
            f"config schedules {total}; keep passes.epochs >= {ckpt.config.passes.epochs}"
        )


def complete_line(ckpt: Checkpoint, config: RunConfig, run_dir: Path) -> str | None:
    """The line that says the run is complete, when ``ckpt`` (the latest) ends the schedule of
    ``config``; None when passes are left to train."""
    stopped = ckpt.stopped or {}
    patience = config.eval.patience
    if stopped.get("kind") == "early" and patience is not None:
        since = int(stopped.get("since_best", patience))
        if since >= patience:
            return (
                f"{run_dir} stopped early after {ckpt.name}: {stopped.get('why')}; nothing "
                f"to resume. To train on: daskhps train {config.source} --resume --set "
                f"eval.patience={since + 1} (or null)"
            )
    total = scheduled_passes(ckpt, config)
    if total is None or ckpt.passes_done != total:
        return None
    epochs = config.passes.epochs
    return (
        f"{run_dir} is complete: {ckpt.name} ends its {counted(total, 'pass', 'passes')} "
        f"({counted(epochs, 'epoch')}); nothing to resume. To train more epochs: daskhps "
        f"train {config.source} --resume --set passes.epochs={epochs + 1}"
    )


def finished_result(run_dir: Path, ckpt: Checkpoint | None, line: str) -> RunResult:
    """What a finished run holds, read back without changing anything (a resume of a
    complete run)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    passes = [rec for line in lines if "restart" not in (rec := json.loads(line))]
    return RunResult(
        run_dir,
        passes=passes,
        final_eval=dict(ckpt.metrics) if ckpt is not None else {},
        complete=line,
        model=ckpt.model if ckpt is not None else None,
        stopped=ckpt.stopped if ckpt is not None else None,
    )


def stores_to_train_in(
    ckpt: Checkpoint | None,
    config: RunConfig,
    num_workers: int,
    copy_from: Path | None,
    echo: Callable[[str], None],
) -> tuple[Path, bool]:
    """The stores to train in, and whether ``ckpt``'s rows must first be written into them
    (re-sharded on the workers: :func:`daskhps.training.placement.place_resharded`): the
    config's for a new run, the checkpoint's on resume, new ones beside the config's when the
    number of workers changed, or the config's when ``ckpt``'s stores belong to the run in
    ``copy_from`` (never written here). Every table's stores are re-sharded or copied."""
    mine = Path(os.path.abspath(config.table.tiers.store_dir))
    if ckpt is None:
        return mine, False
    if copy_from is not None:
        echo(
            f"copying the rows of {ckpt.name} from {ckpt.stores_dir} into {mine}: those "
            f"stores belong to the run in {copy_from}, which this resume must not change"
        )
        return mine, True
    if ckpt.num_workers == num_workers:
        return ckpt.stores_dir, False
    echo(f"re-sharding {ckpt.name} from {ckpt.num_workers} to {counted(num_workers, 'worker')}")
    return resharded_dir(mine, ckpt, num_workers), True


def stores_owner(ckpt: Checkpoint, run_dir: Path) -> Path | None:
    """The folder of another run whose stores ``ckpt`` (a checkpoint in ``run_dir``) reads:
    stores outside ``run_dir`` written by the run in another folder that still holds a
    run (``run_dir`` is a copy of it). None when the stores are this run's own."""
    run = Path(os.path.abspath(run_dir))
    if ckpt.stores_dir.is_relative_to(run):
        return None
    was = (ckpt.run_config.get("run") or {}).get("dir")
    candidates = [Path(os.path.abspath(was))] if isinstance(was, str) else []
    candidates.append(ckpt.stores_dir.parent)  # the default layout: <run.dir>/stores
    for other in candidates:
        if other != run and (other / "checkpoints").is_dir():
            return other
    return None


def resharded_dir(store_dir: str | Path, ckpt: Checkpoint, num_workers: int) -> Path:
    """Where a resume with another worker count writes its stores (beside ``store_dir``)."""
    return Path(f"{store_dir}-resharded-{ckpt.name}-w{num_workers}")


def _wait_unlocked(path: Path, what: str, deadline: float, timeout_s: float) -> None:
    held = WriterLock(path, what).wait_free(deadline)  # writes nothing: maybe another run's
    if held is not None:
        raise ResumeError(
            f"cannot resume: {held} (still held after {timeout_s:g} s; is the run still going?)"
        ) from held


def restore_metrics(path: Path, passes_done: int) -> list[dict[str, Any]]:
    """Keep the lines of ``metrics.jsonl`` up to its ``passes_done``-th pass record (passes
    after the checkpoint are trained again; the restart records among them stay); returns
    the pass records."""
    lines = path.read_text().splitlines() if path.exists() else []
    kept: list[str] = []
    passes: list[dict[str, Any]] = []
    for line in lines:
        rec = json.loads(line)
        if "restart" not in rec:
            if len(passes) == passes_done:
                break
            passes.append(rec)
        kept.append(line)
    if len(passes) < passes_done:
        log.warning("%s holds %d of %d passes' lines", path, len(passes), passes_done)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    os.replace(tmp, path)
    return passes


def plan_fingerprint(files: Sequence[str], lengths: Sequence[int], passes: int) -> dict:
    """What identifies a plan's input: files, their good rows, the number of passes."""
    text = "\n".join(f"{f}\t{n}" for f, n in zip(files, lengths, strict=True))
    return {
        "examples": int(sum(lengths)),
        "passes": int(passes),
        "files": len(files),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
    }


def check_plan(ckpt: Checkpoint, fingerprint: dict, spelled: dict | None = None) -> None:
    """:class:`ResumeError` when the input under the plan changed since the checkpoint.

    ``spelled``: the fingerprint of the same files relative to this folder, as checkpoints
    recorded relative input paths before files were resolved to absolute ones."""
    old = ckpt.plan
    if old is not None and old != fingerprint and old != spelled:
        raise ResumeError(
            f"cannot resume from {ckpt.path}: the training input changed since it was taken "
            f"(plan then: {old}; now: {fingerprint}); a resume replays the same plan: restore "
            "the input files, or start a new run without --resume"
        )

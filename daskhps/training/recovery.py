"""Recovery from a lost worker: what may be retried, how long to wait for workers, and the
record of each restart.

::

    a pass fails with a lost worker or a failed collective (WorkerLostError, CommError,
    KilledWorker) ──► tear down the process group (the survivors drop their unsaved rows)
      ──► wait up to cluster.restart_wait_s for as many workers as the run had
            (replaced by a nanny, a scheduler of a job system, an operator); fewer after it
      ──► the last complete checkpoint of this run, re-sharded when the count changed
      ──► a new process group, the passes after the checkpoint again

A daskhps error of the input, the config or the data (a ConfigError, a DataError, ...) is never
retried: it would fail the same way. Neither is a failure before the run's first checkpoint:
there is nothing to continue from. Each restart is a ``{"restart": ...}`` line in
``metrics.jsonl``, a warning in the log and an entry of ``summary.json``'s ``restarts``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from distributed import KilledWorker

from daskhps._scheduler import scheduler_workers
from daskhps.distributed import CommError, WorkerLostError
from daskhps.errors import DaskHPSError, first_line
from daskhps.runfiles.checkpoint import (
    Checkpoint,
    latest_checkpoint,
    list_checkpoints,
    store_damage,
)
from daskhps.runfiles.replica import Replica, restore_stores

__all__ = [
    "RECOVERABLE",
    "Restart",
    "out_of_restarts",
    "record_restart",
    "recovery_point",
    "restore_from_copy",
    "wait_for_workers",
]

log = logging.getLogger(__name__)

# What a lost machine looks like from the driver (WorkerLostError is a CommError).
RECOVERABLE: tuple[type[BaseException], ...] = (CommError, KilledWorker)


@dataclass(frozen=True)
class Restart:
    """One automatic restart."""

    restart: int  # 1, 2, ... of cluster.max_restarts
    cause: str  # the failure's first line
    checkpoint: str  # what the run continued from
    passes_done: int
    workers_before: int
    workers_after: int
    waited_s: float  # for workers
    seconds: float  # from the failure to training again (teardown, wait, re-shard, setup)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def wait_for_workers(client: Any, want: int, wait_s: float) -> tuple[list[str], float]:
    """Worker addresses in rank order once ``want`` are there, or those present after
    ``wait_s`` seconds (fewer, perhaps none: the caller says so); and the seconds waited."""
    t = time.monotonic()
    while True:
        found = sorted(scheduler_workers(client))
        waited = time.monotonic() - t
        if len(found) >= want or waited >= wait_s:
            return found, waited
        time.sleep(0.25)


def record_restart(metrics_path: Path, restart: Restart) -> None:
    """Append the restart to ``metrics.jsonl`` (a line of its own kind, beside the passes)."""
    with open(metrics_path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"restart": restart.to_json()}) + "\n")


def restore_from_copy(ckpt: Checkpoint, replica: Replica | None) -> None:
    """Put back the rank stores of ``ckpt`` that are missing or damaged from the copy at
    ``checkpoint.replicate_to`` (``replica``), if there is one (what cannot be restored is
    left for the damage check to name)."""
    if replica is not None:
        for line in restore_stores(ckpt, replica):
            log.warning("%s", line)  # a lost disk: worth a line, quiet or not


def recovery_point(run_dir: Path, replica: Replica | None) -> Checkpoint | None:
    """The newest checkpoint in ``run_dir`` whose stores are sound, restored from the copy
    where they went with a lost disk; None when there is none (each one passed over is a
    warning: the run trains its passes again and rewrites it)."""
    for ckpt in reversed(list_checkpoints(run_dir)):
        restore_from_copy(ckpt, replica)
        damage = store_damage(ckpt)
        if not damage:
            return ckpt
        log.warning("cannot continue from %s: its stores are damaged: %s", ckpt.name, damage[0])
    return None


def out_of_restarts(
    error: BaseException, restarts: int, max_restarts: int, run_dir: Path, why: str = ""
) -> DaskHPSError:
    """The error that stops a run after a lost worker it cannot recover from: the cause,
    the restarts used, and where to resume."""
    ckpt = latest_checkpoint(run_dir)
    where = f"resume from {ckpt.name} with --resume" if ckpt else "start it again"
    return WorkerLostError(
        f"{why + ': ' if why else ''}{first_line(error)} (restarts used: {restarts} of "
        f"cluster.max_restarts {max_restarts}); {where} once the workers are back"
    )

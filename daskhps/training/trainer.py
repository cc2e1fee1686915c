"""The driver of a training run: a composition of its phases.

::

    Trainer.run
      preflight (daskhps.training.preflight): every check that needs no worker; nothing written
      [a finished run's resume: one line, nothing else]
      the earlier run moved aside (--overwrite), the folders' state noted (a failed first
        attempt leaves them as it found them)
      cluster (RunParts.start_cluster, or the caller's KeptCluster) ─► the workers' memory
        checked (cluster.address)
        attempt: RunGroup.start (process group, shards) ─► PassLoop.run (daskhps.training.loop)
          a lost worker: tear down, wait for workers, the last sound checkpoint, re-shard when
          the count changed, next attempt (daskhps.training.recovery)
      summary.json
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from daskhps._text import counted
from daskhps.config import RunConfig
from daskhps.data.readers import ClickLog
from daskhps.distributed import RunGroup
from daskhps.distributed.cluster import ClusterHandle, KeptCluster
from daskhps.distributed.disks import remove_folder
from daskhps.errors import ResumeError, first_line
from daskhps.monitor.progress import Progress
from daskhps.passes.scan import remove_spill
from daskhps.runfiles import rundir
from daskhps.runfiles.checkpoint import Checkpoint, list_checkpoints
from daskhps.training import resume as resuming
from daskhps.training.loop import HOLDOUT_SPILL, PassLoop
from daskhps.training.parts import RunParts
from daskhps.training.placement import (
    RESUME_ADVICE,
    place_new_run,
    place_ranks,
    place_resharded,
)
from daskhps.training.preflight import Start, check_cluster_fits, preflight
from daskhps.training.records import RunResult
from daskhps.training.recovery import (
    RECOVERABLE,
    Restart,
    out_of_restarts,
    record_restart,
    recovery_point,
    wait_for_workers,
)

__all__ = ["HOLDOUT_SPILL", "RunResult", "Trainer"]

log = logging.getLogger(__name__)


class Trainer:
    """Runs one training job described by a :class:`RunConfig`.

    ``warm_start``: begin a new run (a new plan, from pass 0) from this checkpoint's state:
    its stores reopened at its commit and written after it, its dense model and optimizer
    loaded, as a resume does; the caller checks that the config is compatible. Daily
    retraining trains each new stretch of days this way. ``eval_before``: evaluate the
    starting model on the holdout before the first pass (``RunResult.initial_eval``).
    ``cluster``: a cluster the caller keeps (started by the run when it needs one, closed by
    the caller; a retraining job publishes with its workers); None: the run's own, closed at
    its end.
    """

    def __init__(
        self,
        config: RunConfig,
        *,
        progress: Progress | None = None,
        echo: Callable[[str], None] | None = None,
        warm_start: Checkpoint | None = None,
        eval_before: bool = False,
        cluster: KeptCluster | None = None,
    ) -> None:
        self.config = config
        self.echo = echo or (lambda message: log.info("%s", message))
        self.run_dir = Path(config.run.dir)
        self.progress = (not config.run.quiet) if progress is None else progress
        self.run_id = f"{config.run.name}-{uuid.uuid4().hex[:8]}"
        self.parts = RunParts(config, self.run_id)
        self.warm_start = warm_start
        self.eval_before = eval_before
        self.kept = cluster
        self._ckpt: Checkpoint | None = None  # what the run continues from
        self._aside: rundir.MovedAside | None = None  # an earlier run --overwrite replaces
        self._start: Start | None = None  # what the preflight found

    def run(
        self, resume: bool = False, *, overwrite: bool = False, checkpoint: str | None = None
    ) -> RunResult:
        """Train; with ``resume``, continue from the run directory's latest checkpoint (or the
        one named ``checkpoint``). A run directory that already holds a run is refused unless
        ``resume`` or ``overwrite`` says what to do with it (:mod:`daskhps.runfiles.rundir`).
        Everything that can be checked is checked before any file is written or removed."""
        cfg = self.config
        if self.kept is None or self.kept.handle is None:
            self.parts.warm_up_workers()  # while the preflight runs
        self._start = start = preflight(
            cfg,
            resume=resume,
            overwrite=overwrite,
            checkpoint=checkpoint,
            warm_start=self.warm_start,
            replica=self.parts.replica(),
            progress=self.progress,
            echo=self.echo,
        )
        self._ckpt = start.ckpt
        if start.complete is not None:
            return resuming.finished_result(self.run_dir, start.ckpt, start.complete)
        # -- from here on files change; an earlier run replaced by --overwrite stays aside
        # until the new run's first checkpoint, and comes back if the run fails before it. A
        # new run that fails before its first checkpoint leaves the folders as it found them.
        fresh = rundir.FreshRun.before(self.run_dir, cfg.table.tiers.store_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            if start.replace and start.earlier is not None:
                self._aside = rundir.move_aside(start.earlier, start.need, cfg.source)
            result = self._run_on_cluster(start.logs)
            (self.run_dir / "summary.json").write_text(json.dumps(self._summary(result), indent=2))
        except BaseException:
            if self._aside is not None:
                self._aside.restore()
            elif start.replace:
                # Ctrl-C as move_aside returned, before ``_aside`` held it: its record says
                # what was moved (no record: move_aside undid itself)
                rundir.settle_interrupted(self.run_dir)
            if self._ckpt is None and not list_checkpoints(self.run_dir):
                fresh.undo()
            raise
        self._first_checkpoint_done()  # checkpoints off: the finished run replaces the old
        return result

    def _first_checkpoint_done(self) -> None:
        """The new run can stand on its own: delete the run that --overwrite replaced."""
        if self._aside is not None:
            self._aside.discard()
            self._aside = None

    def _settle(self) -> None:
        assert self._start is not None
        self._start.settle(self.config, self.run_dir)

    def _run_on_cluster(self, logs: tuple[ClickLog, ClickLog | None]) -> RunResult:
        """Attempts on the cluster until one ends the schedule, or a failure stops the run."""
        cfg = self.config
        recovery = self.parts.recovery_args()
        with self._cluster() as handle:
            if handle.dashboard_link:
                self.echo(f"dashboard: {handle.dashboard_link}")
            addresses = list(handle.addresses)
            client = handle.client
            if not cfg.cluster.local:  # the workers are known only now: size the run on them
                resumed = self._ckpt is not None and self.warm_start is None
                check_cluster_fits(cfg, client, len(addresses), resumed)
            names = [spec.name for spec in cfg.table_specs()]
            target = self._stores(len(addresses))
            addresses = self._place(client, addresses, target)
            stores = target[0]
            try:
                return self._attempts(client, addresses, stores, logs, recovery)
            except BaseException:
                if self._ckpt is None and not list_checkpoints(self.run_dir):
                    # a new run that failed before its first checkpoint: the stores it made
                    # on the workers' disks go (place_new_run found none there before it)
                    try:
                        for name in names:
                            client.run(remove_folder, str(stores / name))
                    except Exception as e:  # a lost worker's disk is gone anyway
                        log.warning("removing the new run's stores on the workers: %s", e)
                raise

    def _attempts(
        self,
        client: Any,
        addresses: list[str],
        stores: Path,
        logs: tuple[ClickLog, ClickLog | None],
        recovery: dict[str, Any],
    ) -> RunResult:
        """Attempts on the cluster until one ends the schedule, or a failure stops the run."""
        restarts: list[Restart] = []
        while True:
            result = RunResult(self.run_dir)
            commit = self._ckpt.commit if self._ckpt is not None else None
            group = RunGroup.start(
                client,
                addresses,
                shards=self.parts.worker_shards(stores, commit),
                **self.parts.comm_args(),
            )
            try:
                self._loop(stores).run(group, logs, result)
            except RECOVERABLE as e:
                failed_at = time.monotonic()
                _close_lost(group, client, stores)
                if len(restarts) >= recovery["max_restarts"]:
                    raise self._out_of_restarts(e, restarts) from e
                if not list_checkpoints(self.run_dir):
                    raise  # nothing of this run to continue from: the error says what
                before = len(addresses)
                found, waited = wait_for_workers(client, before, recovery["wait_s"])
                if not found:
                    raise self._out_of_restarts(e, restarts, "no worker came back") from e
                ckpt, placed = self._recovery_point(client, found)
                if ckpt is None:
                    raise
                restart = self._restart_from(ckpt, e, restarts, before, found, waited)
                target = self._stores(len(found))
                addresses = placed or self._place(client, found, target)
                stores = target[0]
                restarts.append(replace(restart, seconds=time.monotonic() - failed_at))
                record_restart(self.run_dir / "metrics.jsonl", restarts[-1])
                continue
            except BaseException:
                _close_lost(group, client, stores)
                raise
            # Finished: the rows changed since the last checkpoint are kept ("warn"); a
            # diverged run's are its broken passes' (dropped: the checkpoints hold the model).
            diverged = (result.stopped or {}).get("kind") == "diverged"
            try:
                group.close_shards("drop" if diverged else "warn")
                client.run(remove_spill, stores / HOLDOUT_SPILL)
            finally:
                group.close()
            result.restarts = [r.to_json() for r in restarts]
            return result

    def _cluster(self) -> contextlib.AbstractContextManager[ClusterHandle]:
        """The run's own cluster (closed when the block ends), or the caller's kept one."""
        if self.kept is None:
            return self.parts.start_cluster()
        return contextlib.nullcontext(self.kept.get(self.parts.start_cluster))

    def _stores(self, num_workers: int) -> tuple[Path, bool]:
        """The stores this attempt trains in, and whether the checkpoint's rows are first
        re-sharded into them (see :func:`resuming.stores_to_train_in`); another run's stores
        are copied once, by the first attempt."""
        assert self._start is not None
        copy_from, self._start.copy_stores_from = self._start.copy_stores_from, None
        return resuming.stores_to_train_in(
            self._ckpt, self.config, num_workers, copy_from, self.echo
        )

    def _place(self, client: Any, addresses: list[str], stores: tuple[Path, bool]) -> list[str]:
        """The workers in rank order: ranks follow their stores
        (:mod:`daskhps.training.placement`); the checkpoint's rows re-sharded (or copied) on
        the workers first where ``stores`` says so, in address order."""
        cfg, ckpt = self.config, self._ckpt
        folder, rewrite = stores
        if rewrite:
            assert ckpt is not None
            replica = self.parts.replica()
            placed = place_resharded(client, addresses, ckpt, replica, folder, cfg.source)
            return list(placed.addresses)
        if ckpt is None:
            tables = [s.name for s in cfg.table_specs()]  # none may hold stores yet
            assert self._start is not None
            placed = place_new_run(
                *(client, addresses, folder, tables, self.parts.replica(), cfg.source),
                store_bytes=self._start.store_bytes if not cfg.cluster.local else None,
            )
            return list(placed.addresses)
        doing, advice = "continue from", RESUME_ADVICE
        if self.warm_start is not None:  # its copy holds this run's checkpoints, not the base
            doing = "warm-start from"
            advice = (
                "bring back the hosts that held them (this run's copy holds none of another "
                "run's checkpoints)"
            )
        placed = place_ranks(
            client, addresses, ckpt, self.parts.replica(), cfg.source, doing=doing, advice=advice
        )
        return list(placed.addresses)

    def _recovery_point(
        self, client: Any, found: list[str]
    ) -> tuple[Checkpoint | None, list[str] | None]:
        """The newest checkpoint a restart on the workers ``found`` can continue from, and
        its ranks' places when finding it placed them. The embedded cluster's stores are on
        this machine (checked here); a cluster's workers each check their own disk."""
        if self.config.cluster.local:
            return recovery_point(self.run_dir, self.parts.replica()), None
        for ckpt in reversed(list_checkpoints(self.run_dir)):
            if ckpt.num_workers != len(found):
                return ckpt, None  # re-sharded onto the workers left
            try:
                placed = place_ranks(client, found, ckpt, self.parts.replica(), self.config.source)
            except ResumeError as e:
                log.warning("%s", first_line(e))  # it names the checkpoint passed over
                continue
            return ckpt, list(placed.addresses)
        return None, None

    def _loop(self, stores: Path) -> PassLoop:
        return PassLoop(
            self.config,
            self.parts,
            stores,
            self._ckpt,
            warm_start=self.warm_start is not None,
            eval_before=self.eval_before,
            progress=self.progress,
            replica=self.parts.replica(),
            settle=self._settle,
            on_checkpoint=self._first_checkpoint_done,
        )

    def _restart_from(
        self,
        ckpt: Checkpoint,
        error: BaseException,
        restarts: list[Restart],
        before: int,
        addresses: list[str],
        waited: float,
    ) -> Restart:
        """Make the next attempt continue from ``ckpt`` on ``addresses``."""
        cause = first_line(error)
        log.warning(
            "restart %d of %d: %s; continuing from %s (%s done) on %s",
            len(restarts) + 1,
            self.config.cluster.max_restarts,
            cause,
            ckpt.name,
            counted(ckpt.passes_done, "pass", "passes"),
            counted(len(addresses), "worker"),
        )
        self.echo(
            f"restart {len(restarts) + 1}: a worker was lost; continuing from {ckpt.name} on "
            f"{counted(len(addresses), 'worker')}"
        )
        resuming.restore_metrics(self.run_dir / "metrics.jsonl", ckpt.passes_done)
        self._ckpt, self.warm_start = ckpt, None  # from now on a resume of this run
        return Restart(
            restart=len(restarts) + 1,
            cause=cause,
            checkpoint=ckpt.name,
            passes_done=ckpt.passes_done,
            workers_before=before,
            workers_after=len(addresses),
            waited_s=round(waited, 3),
            seconds=0.0,
        )

    def _out_of_restarts(
        self, error: BaseException, restarts: list[Restart], why: str = ""
    ) -> Exception:
        return out_of_restarts(
            error, len(restarts), self.config.cluster.max_restarts, self.run_dir, why
        )

    def _summary(self, result: RunResult) -> dict[str, Any]:
        return {
            "run": self.config.run.name,
            "passes": len(result.passes),
            "examples": int(sum(p["examples"] for p in result.passes)),
            "final_train_loss": result.passes[-1]["train_loss"] if result.passes else None,
            "final_eval": result.final_eval,
            # the checkpoint predict, serve and export take from the run, and its evaluation
            "model": result.model,
            "model_eval": result.model_eval,
            "stopped": result.stopped,
            "examples_per_s": (
                float(np.mean([p["examples_per_s"] for p in result.passes]))
                if result.passes
                else None
            ),
            "restarts": result.restarts,
        }


def _close_lost(group: RunGroup, client: Any, stores: Path) -> None:
    """Stopped (Ctrl-C, an error, a lost worker): the rows changed since the last checkpoint
    are dropped on purpose, a resume or a restart starts from it. A lost rank cannot close;
    the others still do."""
    try:
        group.close_shards("drop")
        client.run(remove_spill, stores / HOLDOUT_SPILL)
    except RECOVERABLE as e:
        log.info("closing the shards after a lost worker: %s", e)
    finally:
        group.close()

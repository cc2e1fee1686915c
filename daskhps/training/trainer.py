"""The driver of a training run: checks, cluster, the run's hosts, then pass after pass.

::

    run: preflight checks (nothing written) ─► cluster ─► RunGroup.start (process group, shards)
    _begin: scan the log once ─► plan ─► dense replicas (restored on resume) ─► metrics.jsonl
    _train: for each pass of daskhps.training.pipeline.PassPipeline (prepared, activated):
              train on every rank (daskhps.training.worker.train_pass), synchronous
              release (unpin; the next pass staged ahead is pinned again)
              evaluate on the holdout (read-only lookups), tier figures ─► PassRecord
              metrics.jsonl line ─► checkpoint when due
    _end:   final commit or evaluation, dense weights
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from daskhps._paths import check_writable_dir
from daskhps._scheduler import scheduler_workers
from daskhps.config import RunConfig
from daskhps.data.holdout import read_train_and_holdout
from daskhps.data.readers import ClickLog
from daskhps.data.source import day_of, resolve_files
from daskhps.distributed import RunGroup, WorkerShards, start_cluster
from daskhps.distributed._errors import WorkerLostError
from daskhps.distributed.cluster import ClusterHandle, cuda_available
from daskhps.errors import (
    ConfigError,
    DaskHPSError,
    DataError,
    ResumeError,
    RunExistsError,
    first_line,
)
from daskhps.monitor.progress import PassProgress
from daskhps.passes import PassPlan, PassSpec, build_plan
from daskhps.passes.plan import day_ends
from daskhps.passes.scan import LogScan, remove_spill, scan_log
from daskhps.sharding import ShardMap
from daskhps.table import TableSpec
from daskhps.table.stats import NO_DAY, day_string
from daskhps.training import resume as resuming
from daskhps.training import rundir, worker
from daskhps.training.checkpoint import (
    Checkpoint,
    checkpoints_dir,
    find_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    remove_checkpoint,
    store_damage,
)
from daskhps.training.checkpointer import Checkpointer, Position
from daskhps.training.holdout import HoldoutStream
from daskhps.training.killpoints import check_env, kill_when_running
from daskhps.training.metrics import evaluate_predictions
from daskhps.training.pipeline import PassContext, PassPipeline, PreparedPass
from daskhps.training.records import Batches, PassRecord, RankPassResult
from daskhps.training.recovery import RECOVERABLE, Restart, record_restart, wait_for_workers
from daskhps.training.replica import Replica, restore_stores

__all__ = ["HOLDOUT_SPILL", "RunResult", "Trainer"]

HOLDOUT_SPILL = ".holdout"  # in the stores' folder (worker-local): the holdout's parts

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a finished run leaves behind (also written to ``summary.json``)."""

    run_dir: Path
    passes: list[dict[str, Any]] = field(default_factory=list)
    final_eval: dict[str, float] = field(default_factory=dict)
    dense_state: dict[str, Any] = field(default_factory=dict)
    initial_eval: dict[str, float] = field(default_factory=dict)  # with eval_before
    restarts: list[dict[str, Any]] = field(default_factory=list)  # automatic, after lost workers
    # a resume found the run finished (nothing trained, nothing written): the line saying so
    complete: str | None = None

    @property
    def pass_losses(self) -> list[float]:
        return [p["train_loss"] for p in self.passes]


@dataclass
class _Start:
    """What the checks before a run found: the earlier run in run.dir, whether it is replaced
    (``--overwrite``), later checkpoints a resume discards, the new run's disk estimate."""

    earlier: rundir.EarlierRun | None
    need: int | None
    replace: bool = False
    discard: list[str] = field(default_factory=list)
    logs: tuple[ClickLog, ClickLog | None] = None  # type: ignore[assignment]
    complete: str | None = None  # a resume of a finished run: the line that says so
    settled: bool = False  # the discards done and config.yaml written


@dataclass(frozen=True)
class _Begun:
    """What the passes of a run start from (:meth:`Trainer._begin`)."""

    plan: PassPlan
    schedule: list[tuple[int, PassSpec]]  # (epoch, pass) in training order
    done: int  # passes of the schedule already done (a resume)
    step: int  # optimizer steps already taken
    total_steps: int
    holdout: HoldoutStream | None
    bad_by_pass: dict[int, dict[str, int]]
    fingerprint: dict[str, Any]
    days: list[str]
    metrics_path: Path
    day_ends: dict[int, int]  # schedule position -> the log day that ends after it (expiry)


class Trainer:
    """Runs one training job described by a :class:`RunConfig`.

    ``warm_start``: begin a new run (a new plan, from pass 0) from this checkpoint's state:
    its stores reopened at its commit and written after it, its dense model and optimizer
    loaded, as a resume does; the caller checks that the config is compatible. Daily
    retraining trains each new stretch of days this way. ``eval_before``: evaluate the
    starting model on the holdout before the first pass (``RunResult.initial_eval``).
    """

    def __init__(
        self,
        config: RunConfig,
        *,
        progress: bool | None = None,
        echo: Callable[[str], None] | None = None,
        warm_start: Checkpoint | None = None,
        eval_before: bool = False,
    ) -> None:
        self.config = config
        self.echo = echo or (lambda message: log.info("%s", message))
        self.run_dir = Path(config.run.dir)
        self.progress = (not config.run.quiet) if progress is None else progress
        self.run_id = f"{config.run.name}-{uuid.uuid4().hex[:8]}"
        self._ckpt: Checkpoint | None = None  # the checkpoint a resume starts from
        self.warm_start = warm_start
        self.eval_before = eval_before
        self._stores = Path(os.path.abspath(config.table.tiers.store_dir))  # trained in
        self._aside: rundir.MovedAside | None = None  # an earlier run --overwrite replaces
        self._start: _Start | None = None  # what the preflight found, once it passed
        self._copy_stores_from: Path | None = None  # another run's stores a resume copies

    # -- setup -------------------------------------------------------------------

    # Each component the run builds from the config comes from one of these methods, so a test
    # can check without a cluster that every key reaches its component (and none is lost).

    def _cluster_args(self) -> dict[str, Any]:
        """The arguments of :func:`start_cluster` (``cluster.*``)."""
        c = self.config.cluster
        return {
            "address": c.address,
            "n_workers": c.n_workers if c.address is None else None,
            "threads_per_worker": c.threads_per_worker,
            "memory_limit": c.memory_limit if c.memory_limit is not None else "auto",
            "processes": c.processes,
            "gpus": c.gpu if c.gpu in (True, False, "auto") else "auto",
            "dashboard_address": c.dashboard_address,
            "security": c.security,
        }

    def _start_cluster(self) -> ClusterHandle:
        return start_cluster(**self._cluster_args())

    def _comm_args(self) -> dict[str, Any]:
        """The process group's arguments of :meth:`RunGroup.start` (``cluster.dist_*``)."""
        c = self.config.cluster
        return {
            "backend": None if c.dist_backend == "auto" else c.dist_backend,
            "timeout_s": c.dist_timeout_s,
        }

    def _recovery_args(self) -> dict[str, Any]:
        """How the run recovers from a lost worker (``cluster.max_restarts``,
        ``cluster.restart_wait_s``)."""
        c = self.config.cluster
        return {"max_restarts": c.max_restarts, "wait_s": c.restart_wait_s}

    def _worker_shards(self, spec: TableSpec) -> WorkerShards:
        """What holds every rank's shard of ``spec`` (the config's table) in ``self._stores``,
        tiered as ``table.tiers`` says."""
        cfg = self.config
        return WorkerShards(
            [spec],
            self._stores,
            cfg.table.tiers.sizing,
            policy=cfg.table.tiers.policy,
            store=cfg.table.tiers.store,
            mode="a",
            commit=self._ckpt.commit if self._ckpt is not None else None,
            admission=cfg.table.admission_rule,
            expiry=cfg.table.expiry.rule(cfg.passes.plan.num_shards),
        )

    def _train_setup(self) -> worker.TrainSetup:
        """What every rank builds its dense replica from (model, dense optimizer, schema)."""
        return worker.TrainSetup.from_config(self.config, self.run_id)

    def _schedule(self, plan: PassPlan) -> list[tuple[int, PassSpec]]:
        """``(epoch, pass)`` in training order: every pass of the plan, ``passes.epochs`` times."""
        return [(epoch, spec) for epoch in range(self.config.passes.epochs) for spec in plan.passes]

    def _batches(self, spec: PassSpec, step: int, total_steps: int) -> Batches:
        """What every rank's mini-batch loop gets for one pass: batch size and learning rates."""
        opt = self.config.dense_optimizer
        return Batches(
            batch_size=self.config.passes.plan.global_batch_size,
            num_batches=spec.num_batches,
            num_examples=spec.num_examples,
            lrs=tuple(
                opt.lr * opt.lr_factor(step + b, total_steps) for b in range(spec.num_batches)
            ),
        )

    def _holdout_batch_size(self, num_workers: int) -> int:
        """Holdout rows per evaluation step over all workers (``eval.batch_size`` each)."""
        return self.config.eval.batch_size * num_workers

    def _evaluates_each_pass(self, holdout: HoldoutStream | None) -> bool:
        return holdout is not None and self.config.eval.every_pass

    def _score(self, pred: np.ndarray, label: np.ndarray) -> dict[str, float]:
        return evaluate_predictions(pred, label, self.config.eval.metrics)

    # -- the run -----------------------------------------------------------------

    def run(
        self, resume: bool = False, *, overwrite: bool = False, checkpoint: str | None = None
    ) -> RunResult:
        """Train; with ``resume``, continue from the run directory's latest checkpoint (or the
        one named ``checkpoint``). A run directory that already holds a run is refused unless
        ``resume`` or ``overwrite`` says what to do with it (:mod:`daskhps.training.rundir`).
        Everything that can be checked is checked before any file is written or removed."""
        cfg = self.config
        start = self._preflight(resume, overwrite, checkpoint)
        if start.complete is not None:
            return resuming.finished_result(self.run_dir, self._ckpt, start.complete)
        logs = start.logs
        # -- from here on files change; an earlier run replaced by --overwrite stays aside
        # until the new run's first checkpoint, and comes back if the run fails before it. A
        # new run that fails before its first checkpoint leaves the folders as it found them.
        self._start = start
        fresh = rundir.FreshRun.before(self.run_dir, cfg.table.tiers.store_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if start.replace and start.earlier is not None:
            self._aside = rundir.move_aside(start.earlier, start.need, cfg.source)
        try:
            if self._ckpt is not None:
                resuming.wait_for_stores(self._ckpt)  # the killed run's workers may still exit
            result = self._run_on_cluster(logs)
            (self.run_dir / "summary.json").write_text(json.dumps(self._summary(result), indent=2))
        except BaseException:
            if self._aside is not None:
                self._aside.restore()
            elif self._ckpt is None and not list_checkpoints(self.run_dir):
                fresh.undo()
            raise
        self._first_checkpoint_done()  # checkpoints off: the finished run replaces the old
        return result

    def _settle_start(self) -> None:
        """The checks that needed the cluster passed: discard the checkpoints a resume from an
        earlier one replaces, and record the config (once per run, not per restart)."""
        start = self._start
        if start is None or start.settled:
            return
        for name in start.discard:
            # a warning, quiet or not: it removes a checkpoint the user may look for
            log.warning("discarding checkpoint %s: the run resumes from an earlier one", name)
            remove_checkpoint(checkpoints_dir(self.run_dir) / name)
        (self.run_dir / "config.yaml").write_text(self.config.to_yaml())
        start.settled = True

    def _preflight(self, resume: bool, overwrite: bool, checkpoint: str | None) -> _Start:
        """Every check that needs no worker, in an order that touches nothing but generated
        logs; raises with one line naming the key, path or flag that would fix it."""
        cfg = self.config
        from daskhps.capacity import check_fits

        # Folders that cannot be written: named now, not as an errno on a worker (and before
        # check_fits, which would find no free space there).
        check_writable_dir(self.run_dir, "the run", "set run.dir to a writable folder")
        check_writable_dir(
            cfg.table.tiers.store_dir,
            "the table's stores",
            "set table.tiers.store_dir to a writable folder",
        )
        replica = self._replica()
        if replica is not None:
            replica.check_writable(cfg.source)
        if resume and checkpoint is None and self.warm_start is None:
            # A finished run: say so before sizing or starting anything (a config it refuses
            # and damaged stores are still refused: they need fixing either way; a store lost
            # with its disk comes back from the copy, as a resume would restore it)
            done = latest_checkpoint(self.run_dir)
            line = None if done is None else resuming.complete_line(done, cfg, self.run_dir)
            if done is not None and line is not None:
                resuming.check_resume(done, cfg)
                self._restore_from_copy(done)
                _refuse_damaged_stores(done)
                self._ckpt = done
                return _Start(earlier=None, need=None, complete=line)
        self._check_data_paths()  # a typo'd path alone, not after warnings sizing its logs
        sizing = check_fits(cfg, resume=resume)  # refuse a run that cannot fit: plan's message
        check_env()  # a malformed DASKHPS_KILL_AT fails before anything starts
        if resume and self.warm_start is not None:
            raise ResumeError("a run resumes its own checkpoint or warm-starts, not both")
        if checkpoint is not None and not resume:
            raise ResumeError(
                f"--checkpoint {checkpoint} names the checkpoint a resume continues from; add "
                "--resume"
            )
        self._check_gpu()
        store_dir = Path(cfg.table.tiers.store_dir)
        rundir.ensure_no_run_dir_clash(self.run_dir, store_dir)
        rundir.settle_interrupted(self.run_dir)  # a killed --overwrite, put right
        rundir.refuse_published(self.run_dir, store_dir, cfg.source)
        earlier = rundir.find_earlier_run(self.run_dir, store_dir)
        start = _Start(earlier=earlier, need=sizing.disk.total)
        if resume:
            self._ckpt = ckpt = self._resume_point(checkpoint)
            later = [c for c in list_checkpoints(self.run_dir) if c.passes_done > ckpt.passes_done]
            self._check_stores_owner(ckpt)
            start.discard = [c.name for c in later]
            if start.discard and not overwrite:
                raise RunExistsError(
                    f"{cfg.source}: resuming from {self._ckpt.name} rewrites the later "
                    f"checkpoints of {self.run_dir} ({', '.join(start.discard)}); add --overwrite "
                    "to discard them, or resume from the latest (leave out --checkpoint)"
                )
        else:
            self._ckpt = self.warm_start
            if self.warm_start is not None:
                _refuse_damaged_stores(self.warm_start)
            if earlier is not None and not overwrite:
                raise RunExistsError(
                    f"{cfg.source}: {self.run_dir} already holds a run ({earlier.describe()}); "
                    "pass --resume to continue it, or --overwrite to start over (the earlier "
                    "run is deleted once the new run's first checkpoint is complete), or set "
                    "run.dir to a new folder"
                )
            start.replace = earlier is not None
        if cfg.data.generate is not None:
            cfg.data.generate.ensure(progress=self.progress)
        # Read (lazily) before anything changes: paths that match nothing fail in a second.
        start.logs = read_train_and_holdout(
            cfg.data.source,
            cfg.data.holdout,
            cfg.data.backend,
            cfg.data.block_size,
            summarised=True,  # by the planning scan, once: the passes re-read the files
        )
        self._check_expiry_days(start.logs[0])
        return start

    def _check_data_paths(self) -> None:
        """``data.train`` matches data files (generated logs are checked once generated)."""
        if self.config.data.train is None:
            return
        src = self.config.data.source
        try:
            resolve_files(src.paths, src.days, src.require_complete)
        except DataError as e:
            raise DataError(f"{self.config.source}: data.train: {e}") from None

    def _check_expiry_days(self, train_log: ClickLog) -> None:
        """Expiry by log days needs logs in ``day=YYYY-MM-DD`` folders: refused otherwise."""
        ttl = self.config.table.expiry.ttl_days
        dayless = [f for f in train_log.files if day_of(f) is None]
        if ttl is not None and dayless:
            raise ConfigError(
                f"{self.config.source}: table.expiry.ttl_days: {ttl} needs log days, but "
                f"{dayless[0]} is in no day=YYYY-MM-DD folder; put the logs in day partitions, "
                "or bound the table with table.expiry.max_rows instead"
            )

    def _check_gpu(self) -> None:
        c = self.config.cluster
        if c.gpu is True and c.address is None and not cuda_available():
            raise ConfigError(
                f"{self.config.source}: cluster.gpu: true, but this machine has no CUDA GPU (or "
                "no dask_cuda); set cluster.gpu: auto (a GPU where there is one) or false"
            )

    def _first_checkpoint_done(self) -> None:
        """The new run can stand on its own: delete the run that --overwrite replaced."""
        if self._aside is not None:
            self._aside.discard()
            self._aside = None

    def _run_on_cluster(self, logs: tuple[ClickLog, ClickLog | None]) -> RunResult:
        cfg = self.config
        recovery = self._recovery_args()
        restarts: list[Restart] = []
        with self._start_cluster() as handle:
            if handle.dashboard_link:
                self.echo(f"dashboard: {handle.dashboard_link}")
            addresses = list(handle.addresses)
            client = handle.client
            if not cfg.cluster.local:  # the workers are known only now: size the run on them
                self._check_cluster_fits(client, len(addresses))
            spec = cfg.table_spec()
            self._stores = self._stores_dir(len(addresses))
            while True:
                result = RunResult(self.run_dir)
                group = RunGroup.start(
                    client, addresses, shards=self._worker_shards(spec), **self._comm_args()
                )
                try:
                    self._train(group, logs, result)
                except RECOVERABLE as e:
                    failed_at = time.monotonic()
                    self._close_lost(group, client)
                    if len(restarts) >= recovery["max_restarts"]:
                        raise self._out_of_restarts(e, restarts) from e
                    ckpt = self._recovery_point()
                    if ckpt is None:
                        raise  # nothing of this run to continue from: the error says what
                    before = len(addresses)
                    addresses, waited = wait_for_workers(client, before, recovery["wait_s"])
                    if not addresses:
                        raise self._out_of_restarts(e, restarts, "no worker came back") from e
                    restarts.append(
                        self._restart_from(ckpt, e, restarts, before, addresses, waited)
                    )
                    restarts[-1] = replace(restarts[-1], seconds=time.monotonic() - failed_at)
                    record_restart(self.run_dir / "metrics.jsonl", restarts[-1])
                    continue
                except BaseException:
                    self._close_lost(group, client)
                    raise
                # Finished: the rows changed since the last checkpoint are kept ("warn").
                try:
                    group.close_shards("warn")
                    client.run(remove_spill, self._stores / HOLDOUT_SPILL)
                finally:
                    group.close()
                result.restarts = [r.to_json() for r in restarts]
                return result

    def _close_lost(self, group: RunGroup, client: Any) -> None:
        """Stopped (Ctrl-C, an error, a lost worker): the rows changed since the last
        checkpoint are dropped on purpose, a resume or a restart starts from it. A lost rank
        cannot close; the others still do."""
        try:
            group.close_shards("drop")
            client.run(remove_spill, self._stores / HOLDOUT_SPILL)
        except RECOVERABLE as e:
            log.info("closing the shards after a lost worker: %s", e)
        finally:
            group.close()

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
            "restart %d of %d: %s; continuing from %s (%d passes done) on %d workers",
            len(restarts) + 1,
            self.config.cluster.max_restarts,
            cause,
            ckpt.name,
            ckpt.passes_done,
            len(addresses),
        )
        self.echo(
            f"restart {len(restarts) + 1}: a worker was lost; continuing from {ckpt.name} on "
            f"{len(addresses)} workers"
        )
        resuming.restore_metrics(self.run_dir / "metrics.jsonl", ckpt.passes_done)
        self._ckpt, self.warm_start = ckpt, None  # from now on a resume of this run
        resuming.wait_for_stores(ckpt)
        self._stores = self._stores_dir(len(addresses))
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
    ) -> DaskHPSError:
        ckpt = latest_checkpoint(self.run_dir)
        where = f"resume from {ckpt.name} with --resume" if ckpt else "start it again"
        used = f"{len(restarts)} of cluster.max_restarts {self.config.cluster.max_restarts}"
        cause = first_line(error)
        return WorkerLostError(
            f"{why + ': ' if why else ''}{cause} (restarts used: {used}); {where} once the "
            "workers are back"
        )

    def _resume_point(self, name: str | None) -> Checkpoint:
        if name is not None:
            ckpt = find_checkpoint(self.run_dir, name)
        else:
            found = latest_checkpoint(self.run_dir)
            if found is None:
                raise ResumeError(
                    f"cannot resume: {checkpoints_dir(self.run_dir)} holds no complete "
                    "checkpoint; start over with --overwrite (or without --resume in a new "
                    "run.dir)"
                )
            ckpt = found
        changes = resuming.check_resume(ckpt, self.config)
        resuming.check_epochs(ckpt, self.config)
        self._restore_from_copy(ckpt)
        _refuse_damaged_stores(ckpt)
        accepted = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())
        self.echo(
            f"resuming from {ckpt.path} ({ckpt.passes_done} passes done)"
            + (f"; changed: {accepted}" if accepted else "")
        )
        return ckpt

    def _check_stores_owner(self, ckpt: Checkpoint) -> None:
        """A resume never writes the stores of another run: stores outside this run's folder
        that the run in another folder trains in (this one a copy of it) are copied into the
        config's ``table.tiers.store_dir`` first, or refused when that is the same folder."""
        owner = resuming.stores_owner(ckpt, self.run_dir)
        if owner is None:
            return
        target = Path(os.path.abspath(self.config.table.tiers.store_dir))
        where = f"{ckpt.name} of {self.run_dir}"
        if target == ckpt.stores_dir or target.is_relative_to(ckpt.stores_dir):
            raise ResumeError(
                f"{self.config.source}: cannot resume {where}: its stores {ckpt.stores_dir} "
                f"belong to the run in {owner}, and resuming here would change that run; set "
                "table.tiers.store_dir to a folder of this run's own (the resume copies the "
                "checkpoint's rows there first)"
            )
        if rundir.non_empty_stores(target):
            raise ResumeError(
                f"{self.config.source}: cannot resume {where}: its stores {ckpt.stores_dir} "
                f"belong to the run in {owner}, so the resume copies them into "
                f"table.tiers.store_dir {target}, which holds stores already; empty it or set "
                "table.tiers.store_dir to a new folder"
            )
        self._copy_stores_from = owner

    def _check_cluster_fits(self, client: Any, workers: int) -> None:
        """Refuse, in one line, a run that cannot fit the memory of the workers behind
        ``cluster.address`` (the embedded cluster's was sized by the preflight)."""
        from daskhps.capacity.fit import check_cluster_fits

        limits = [int(w.get("memory_limit") or 0) for w in scheduler_workers(client).values()]
        check_cluster_fits(
            self.config,
            workers=workers,
            memory_limit=min(limits, default=0) or None,
            resume=self._ckpt is not None and self.warm_start is None,
        )

    def _replica(self) -> Replica | None:
        url = self.config.checkpoint.replicate_to
        return None if url is None else Replica(url)

    def _recovery_point(self) -> Checkpoint | None:
        """The newest checkpoint of this run whose stores are sound, restored from the copy
        where they went with a lost disk; None when there is none (each one passed over is
        a warning: the run trains its passes again and rewrites it)."""
        for ckpt in reversed(list_checkpoints(self.run_dir)):
            self._restore_from_copy(ckpt)
            damage = store_damage(ckpt)
            if not damage:
                return ckpt
            log.warning("cannot continue from %s: its stores are damaged: %s", ckpt.name, damage[0])
        return None

    def _restore_from_copy(self, ckpt: Checkpoint) -> None:
        """Put back the rank stores of ``ckpt`` that are missing or damaged from the copy at
        ``checkpoint.replicate_to``, if there is one (what cannot be restored is left for the
        damage check to name)."""
        replica = self._replica()
        if replica is not None:
            for line in restore_stores(ckpt, replica):
                log.warning("%s", line)  # a lost disk: worth a line, quiet or not

    def _stores_dir(self, num_workers: int) -> Path:
        """The stores to train in: the config's for a new run, the checkpoint's on resume,
        re-sharded from the checkpoint's when the number of workers changed."""
        ckpt = self._ckpt
        if ckpt is None:
            return Path(os.path.abspath(self.config.table.tiers.store_dir))
        if self._copy_stores_from is not None:  # another run's stores: never written here
            out = Path(os.path.abspath(self.config.table.tiers.store_dir))
            self.echo(
                f"copying the rows of {ckpt.name} from {ckpt.stores_dir} into {out}: those "
                f"stores belong to the run in {self._copy_stores_from}, which this resume "
                "must not change"
            )
            self._copy_stores_from = None
            return resuming.reshard(ckpt, num_workers, out)
        if ckpt.num_workers == num_workers:
            return ckpt.stores_dir
        out = resuming.resharded_dir(self.config.table.tiers.store_dir, ckpt, num_workers)
        self.echo(f"re-sharding {ckpt.name} from {ckpt.num_workers} to {num_workers} workers")
        return resuming.reshard(ckpt, num_workers, out)

    def _train(
        self, group: RunGroup, logs: tuple[ClickLog, ClickLog | None], result: RunResult
    ) -> None:
        """Every pass of the schedule not done yet, through the pass pipeline."""
        cfg = self.config
        client, addresses = group.client, list(group.addresses)
        begun = self._begin(group, logs, result)
        ctx = PassContext(
            group,
            logs[0],
            begun.plan,
            ShardMap(cfg.passes.plan.num_shards, len(addresses)),
            cfg.table.name,
            cfg.passes.plan.global_batch_size,
        )
        checkpointer = Checkpointer(
            cfg, self.run_dir, group, self._stores, begun.days, begun.fingerprint, self._replica()
        )
        ckpt = self._ckpt
        if (
            checkpointer.replica is not None
            and ckpt is not None
            and self.warm_start is None
            and ckpt.stores_dir == self._stores  # not re-sharded: these stores are its
            and not checkpointer.replica.has_checkpoint(ckpt.name)
        ):
            checkpointer.replicate(ckpt)  # a copy that failed or began with this resume
        if ckpt is not None and self.warm_start is None:  # a resume: the days so far
            checkpointer.lifecycle = {d: dict(v) for d, v in ckpt.lifecycle.items()}
        last_day = [span[1] if span else None for span in begun.plan.pass_days()]
        progress = PassProgress(
            client,
            self.run_id,
            addresses,
            total_passes=len(begun.schedule),
            total_batches=begun.total_steps,
            batches_done=begun.step,
            show=self.progress,
        )
        specs = [spec for _, spec in begun.schedule]
        step = begun.step
        admits = not cfg.table.admission_rule.admits_all
        with progress, PassPipeline(ctx, specs, begun.done, _overlaps(client, addresses)) as pipe:
            for active in pipe:
                progress.start_pass(active.position + 1)
                epoch = begun.schedule[active.position][0]
                admitted = active.admit(ctx) if admits else None
                rec = self._train_pass(ctx, active, step, begun.total_steps)
                rec.admission = admitted or {}
                rec.seconds["count"] = active.record_seen(ctx)
                if active.position in begun.day_ends:  # a log day ends: rows expire
                    rec.expiry = active.expire(ctx, begun.day_ends[active.position])
                    rec.seconds["expire"] = active.seconds["expire"]  # after train copied them
                _note_lifecycle(checkpointer.lifecycle, rec, last_day[active.spec.index])
                rec.seconds["unpin_repin"] = pipe.release(active)
                self._finish_record(ctx, rec, begun, active.spec, epoch)
                step += active.spec.num_batches
                progress.end_pass(active.spec.num_batches, rec.train_loss, rec.auc)
                result.passes.append(line := rec.to_json())
                with begun.metrics_path.open("a") as f:
                    f.write(json.dumps(line) + "\n")
                pos = Position(
                    active.position + 1, len(specs), epoch + 1, active.spec.index + 1, step
                )
                if checkpointer.due(pos):
                    checkpointer.take(pos, rec)
                    self._first_checkpoint_done()
        self._end(group, begun.holdout, result)

    def _begin(
        self, group: RunGroup, logs: tuple[ClickLog, ClickLog | None], result: RunResult
    ) -> _Begun:
        """Scan the log, plan its passes, check a resume against them, build (and restore)
        the dense replicas, and start (or restore) ``metrics.jsonl``."""
        cfg = self.config
        client, addresses = group.client, list(group.addresses)
        train_log, holdout_log = logs
        # One streaming read of the log: good rows per partition (the plan's input), bad rows,
        # and the holdout written to the workers' disks. Nothing of the log stays in memory:
        # each pass reads its own partitions again when it is prepared.
        spill = self._stores / HOLDOUT_SPILL
        client.run(remove_spill, spill)  # a killed run's
        scan = scan_log(train_log, holdout_log, spill if holdout_log is not None else None)
        self._refuse_empty(scan, train_log)
        plan = build_plan(
            train_log,
            cfg.passes.plan,
            len(addresses),
            seed=cfg.run.seed,
            partition_lengths=scan.lengths,
        )
        _warn_rereads(plan, cfg.data.block_size)
        fingerprint = resuming.plan_fingerprint(
            plan.files, plan.partition_lengths, len(plan.passes)
        )
        ckpt = self._ckpt
        resumed = ckpt is not None and self.warm_start is None  # else a new plan from pass 0
        if resumed:
            assert ckpt is not None
            relative = [os.path.relpath(f) for f in plan.files]
            spelled = resuming.plan_fingerprint(relative, plan.partition_lengths, len(plan.passes))
            resuming.check_plan(ckpt, fingerprint, spelled)
        scan.report.log_summary(log)
        holdout = self._holdout(client, scan, addresses) if holdout_log is not None else None
        group.run(worker.setup_trainer, self._train_setup(), what="build dense replicas")
        schedule = self._schedule(plan)
        done = ckpt.passes_done if ckpt is not None and resumed else 0
        metrics_path = self.run_dir / "metrics.jsonl"
        if ckpt is not None:
            if resumed and done > len(schedule):
                raise ResumeError(
                    f"cannot resume from {ckpt.path}: it is {done} passes in, but the config "
                    f"schedules {len(schedule)}; keep passes.epochs >= {ckpt.config.passes.epochs}"
                )
            group.run(
                worker.load_dense_checkpoint,
                ckpt.dense_state(),
                ckpt.optimizer_state(),
                ckpt.rng_states(),
                what="restore dense replicas",
            )
        self._settle_start()  # every refusal is behind: the run's files may change now
        if resumed:
            result.passes.extend(resuming.restore_metrics(metrics_path, done))
        else:
            metrics_path.write_text("")
        if self.eval_before and holdout is not None:
            result.initial_eval = self._evaluate(group, holdout)
        return _Begun(
            plan=plan,
            schedule=schedule,
            done=done,
            step=sum(spec.num_batches for _, spec in schedule[:done]),
            total_steps=sum(spec.num_batches for _, spec in schedule),
            holdout=holdout,
            bad_by_pass=_bad_rows_by_pass(scan.report.by_shard(), plan),
            fingerprint=fingerprint,
            days=sorted({d for f in plan.files if (d := day_of(f)) is not None}),
            metrics_path=metrics_path,
            day_ends=self._day_ends(plan, schedule),
        )

    def _refuse_empty(self, scan: LogScan, train_log: ClickLog) -> None:
        """A run whose training files gave no row trains nothing: a failure, in one line
        naming the first file that could not be read and where it was read."""
        if sum(scan.lengths):
            return
        by_file = scan.report.by_shard()
        unreadable = [f for f, reasons in by_file.items() if "unreadable_shard" in reasons]
        address = self.config.cluster.address
        where = f"the workers at cluster.address {address}" if address else "the workers"
        first = unreadable[0] if unreadable else (sorted(by_file) or train_log.files)[0]
        why = "could not be read" if unreadable else "held no good row"
        raise DataError(
            f"{self.config.source}: none of the {len(train_log.files)} training files gave a "
            f"row: {first} {why} on {where} (paths are resolved on the driver, in "
            f"{os.getcwd()}); every worker must see the same files: put the logs on a disk "
            "all workers share, or start the workers where they can read them"
        )

    def _day_ends(self, plan: PassPlan, schedule: list[tuple[int, PassSpec]]) -> dict[int, int]:
        """Where the passes end a log day, for expiry (``ttl_days`` on logs without days was
        refused before the cluster started). Without days, ``max_rows`` applies at the end."""
        expiry = self.config.table.expiry
        if expiry.ttl_days is None and expiry.max_rows is None:
            return {}
        per_pass = plan.pass_days()
        ends = day_ends([per_pass[spec.index] for _, spec in schedule])
        return ends if ends else {len(schedule) - 1: NO_DAY}

    def _end(self, group: RunGroup, holdout: HoldoutStream | None, result: RunResult) -> None:
        """Commit the final rows (without checkpoints), evaluate at the end (without
        ``eval.every_pass``), take the dense weights, drop the replicas."""
        if not self.config.checkpoint.enabled:  # else the last checkpoint committed them
            group.on_shards(
                WorkerShards.commit, "end", {"passes": len(result.passes)}, what="commit shards"
            )
        if result.passes:
            result.final_eval = result.passes[-1].get("eval", {})
        if holdout is not None and not result.final_eval:  # eval.every_pass off: at the end
            result.final_eval = self._evaluate(group, holdout)
        result.dense_state = group.run(worker.model_state, what="dense weights")[0]
        group.run(worker.drop_trainer, what="drop dense replicas")

    def _holdout(self, client: Any, scan: LogScan, addresses: list[str]) -> HoldoutStream | None:
        """The holdout the scan set aside, evaluated in chunks of at most a pass's size."""
        if not scan.holdout_rows:
            log.warning("the holdout has no rows: nothing is evaluated")
            return None
        bs = self._holdout_batch_size(len(addresses))
        chunk = max(self.config.passes.plan.examples_per_pass, bs)
        return HoldoutStream(client, scan.holdout, addresses, bs, chunk)

    def _train_pass(
        self, ctx: PassContext, active: PreparedPass, step: int, total_steps: int
    ) -> PassRecord:
        """Train an activated pass on every rank; its record, without evaluation or tiers."""
        spec = active.spec
        batches = self._batches(spec, step, total_steps)
        t = time.perf_counter()
        disarm = kill_when_running(
            ctx.group.client, "daskhps-train-pass-", ctx.group.world_size, active.position
        )
        try:
            outs: list[RankPassResult] = ctx.group.run(
                worker.train_pass,
                batches,
                rank_args=[(f,) for f in active.examples],
                what="train pass",
                stage="train",
            )
        finally:
            disarm()
        train_s = time.perf_counter() - t
        rec = PassRecord.of_ranks(
            outs,
            pass_number=active.position + 1,
            pass_in_epoch=spec.index + 1,
            batches=batches,
            train_seconds=train_s,
            rows_staged=int(sum(r.rows for r in active.reports)),
            staged_from=active.staged_from(),
        )
        rec.seconds = {**active.seconds, "train": train_s}
        return rec

    def _finish_record(
        self, ctx: PassContext, rec: PassRecord, begun: _Begun, spec: PassSpec, epoch: int
    ) -> None:
        """Evaluate (``eval.every_pass``), take the tiers' figures (after the release) and the
        bad rows skipped (counted when their file is first read: in the first epoch)."""
        if self._evaluates_each_pass(begun.holdout):
            assert begun.holdout is not None
            t = time.perf_counter()
            rec.eval = self._evaluate(ctx.group, begun.holdout)
            rec.seconds["eval"] = time.perf_counter() - t
        stats = ctx.group.on_shards(WorkerShards.stats, what="shard stats")
        rec.tiers = _tier_summary(stats, ctx.table)
        if rec.admission:  # the keys waiting for admission after this pass, and their bytes
            pending = [s["tables"][ctx.table]["pending"] for s in stats]
            rec.admission["pending_keys"] = sum(p["keys"] for p in pending)
            rec.admission["pending_bytes"] = sum(p["bytes"] for p in pending)
        rec.epoch = epoch + 1
        rec.bad_rows_skipped = begun.bad_by_pass.get(spec.index, {}) if epoch == 0 else {}

    def _evaluate(self, group: RunGroup, holdout: HoldoutStream) -> dict[str, float]:
        def run_chunk(placed: Any) -> list[tuple[np.ndarray, np.ndarray]]:
            return group.run(
                worker.eval_pass,
                Batches(holdout.batch_size, placed.num_batches),
                rank_args=[(f,) for f in placed.futures],
                what="eval holdout",
                stage="eval",
            )

        return self._score(*holdout.evaluate(run_chunk))

    def _summary(self, result: RunResult) -> dict[str, Any]:
        return {
            "run": self.config.run.name,
            "passes": len(result.passes),
            "examples": int(sum(p["examples"] for p in result.passes)),
            "final_train_loss": result.passes[-1]["train_loss"] if result.passes else None,
            "final_eval": result.final_eval,
            "examples_per_s": (
                float(np.mean([p["examples_per_s"] for p in result.passes]))
                if result.passes
                else None
            ),
            "restarts": result.restarts,
        }


def _note_lifecycle(lifecycle: dict[str, dict[str, int]], rec: PassRecord, day: int | None) -> None:
    """Add a pass's admitted keys (to the last log day of its rows) and expired rows (to the
    day that ended) to the run's figures per day (checkpoints and ``inspect`` show them)."""
    if rec.admission and day is not None:
        per = lifecycle.setdefault(day_string(day) or "", {"admitted": 0, "expired": 0})
        per["admitted"] += int(rec.admission["admitted"])
    if rec.expiry and rec.expiry.get("day"):
        per = lifecycle.setdefault(rec.expiry["day"], {"admitted": 0, "expired": 0})
        per["expired"] += int(rec.expiry["expired"])


def _refuse_damaged_stores(ckpt: Checkpoint) -> None:
    """Stop before any worker starts when the stores ``ckpt`` reads are damaged (sizes only:
    a ``stat`` per file), naming the first problem and what to do."""
    damage = store_damage(ckpt)
    if damage:
        more = (
            f" (and {len(damage) - 1} more; daskhps inspect lists them)" if len(damage) > 1 else ""
        )
        raise ResumeError(
            f"cannot train from checkpoint {ckpt.name} of {ckpt.path.parent.parent}: its stores "
            f"are damaged: {damage[0]}{more}; restore the files from a backup, or continue from "
            "an earlier intact checkpoint with --resume --checkpoint NAME --overwrite"
        )


def _bad_rows_by_pass(
    by_file: dict[str, dict[str, int]], plan: PassPlan
) -> dict[int, dict[str, int]]:
    """Skipped rows by reason, attributed to the pass in which each file starts (its first
    block, for a file read in blocks)."""
    lengths = np.asarray(plan.partition_lengths, dtype=np.int64)
    begins = np.cumsum(lengths) - lengths
    starts = np.array([p.start for p in plan.passes], dtype=np.int64)
    out: dict[int, dict[str, int]] = {}
    seen: set[str] = set()
    for f, b in zip(plan.files, begins, strict=True):
        if f not in by_file or not len(starts) or f in seen:
            continue
        seen.add(f)
        index = plan.passes[max(int(np.searchsorted(starts, b, side="right")) - 1, 0)].index
        for reason, n in by_file[f].items():
            out.setdefault(index, {})[reason] = out.get(index, {}).get(reason, 0) + int(n)
    return out


def _warn_rereads(plan: PassPlan, block_size: int | None) -> None:
    """A partition read by many passes costs a read each, and a file that could not be cut
    into blocks (compressed, parquet, or ``data.block_size: null``) is read whole: say which,
    and what would fix it. Files within a block cost little to read again, and say nothing."""
    reads = plan.passes_per_partition()
    limit = block_size or 0
    parts_of = Counter(plan.files)  # a file read in blocks is several partitions
    many = [
        i
        for i in np.flatnonzero(reads > 2).tolist()
        if parts_of[plan.files[i]] == 1
        and os.path.exists(plan.files[i])
        and os.path.getsize(plan.files[i]) > limit
    ]
    if many:
        worst = max(many, key=lambda i: int(reads[i]))
        log.warning(
            "%d input files are each read whole by more than 2 passes (%s by %d): each pass "
            "reads a file that cannot be cut into blocks whole; split such files into parts "
            "of about a pass (passes.examples_per_pass rows), or decompress them so "
            "data.block_size can cut them",
            len(many),
            plan.files[worst],
            int(reads[worst]),
        )


def _overlaps(client: Any, addresses: list[str]) -> bool:
    """Whether pass k+1 is prepared while pass k trains: with two threads per worker."""
    if _min_threads(client, addresses) >= 2:
        return True
    log.warning(
        "workers have one thread each: pass k+1 is prepared after pass k instead of while it "
        "trains; give workers 2 threads (cluster.threads_per_worker) to overlap"
    )
    return False


def _min_threads(client: Any, addresses: list[str]) -> int:
    workers = scheduler_workers(client)
    return min(int(workers[a].get("nthreads", 1)) for a in addresses)


def _tier_summary(stats: list[dict[str, Any]], table: str) -> dict[str, Any]:
    """Hit rates and store traffic of one table, summed over workers, and the table's resident
    bytes on each worker (tiers with their indexes, and the store's key index)."""
    rows_from: dict[str, int] = {}
    store_read = store_written = 0
    resident = []
    for s in stats:
        t = s["tables"][table]
        resident.append(
            int(
                t.get("device", {}).get("bytes", 0)
                + t.get("host", {}).get("bytes", 0)
                + t.get("store", {}).get("index_bytes", 0)
            )
        )
        for k, v in t.get("rows_from", {}).items():
            rows_from[k] = rows_from.get(k, 0) + int(v)
        store_read += int(t.get("store", {}).get("rows_read", 0))
        store_written += int(t.get("store", {}).get("rows_written", 0))
    total = sum(rows_from.values())
    return {
        "rows_from": rows_from,
        "hit_rate": {k: (v / total if total else 0.0) for k, v in rows_from.items()},
        "store_rows_read": store_read,
        "store_rows_written": store_written,
        "table_bytes": resident,
    }

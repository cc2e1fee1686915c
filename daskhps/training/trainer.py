"""The driver of a training run: cluster, shards, process group, then pass after pass.

One pass, as the driver sees it::

    plan keys of pass k ──shuffle to owners──► stage into each owner's device tier (pinned)
    route examples of pass k to the worker that trains them
    all ranks: mini-batch loop (daskhps.training.worker.train_pass), synchronous
    unpin ─► evaluate on the holdout (read-only lookups) ─► metrics.jsonl line
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from daskhps._paths import check_writable_dir
from daskhps._scheduler import scheduler_workers
from daskhps.config import RunConfig
from daskhps.data.holdout import read_train_and_holdout
from daskhps.data.readers import ClickLog
from daskhps.distributed import (
    ShardHost,
    TierSizing,
    close_shards,
    commit_shards,
    init_comm,
    local_shards,
    open_shards,
    run_pinned,
    shard_stats,
    stage_shards,
    start_cluster,
    try_stage_shards,
)
from daskhps.distributed.cluster import ClusterHandle, cuda_available
from daskhps.distributed.comm import CommGroup
from daskhps.errors import ConfigError, ResumeError, RunExistsError
from daskhps.monitor import announce_pass
from daskhps.monitor.progress import BatchProgress
from daskhps.passes import PassPlan, PassSpec, build_plan, owner_keys, place_together
from daskhps.passes.keys import pass_keys, pass_partitions
from daskhps.passes.scan import LogScan, remove_spill, scan_log
from daskhps.sharding import ShardMap
from daskhps.table import StageReport, TableSpec
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
from daskhps.training.examples import route_examples
from daskhps.training.holdout import HoldoutStream
from daskhps.training.killpoints import check_env, kill_point, kill_when_running
from daskhps.training.metrics import evaluate_predictions

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

    @property
    def pass_losses(self) -> list[float]:
        return [p["train_loss"] for p in self.passes]


def _unpin(table: str) -> None:
    local_shards().unpin(table)


@dataclass
class _Start:
    """What the checks before a run found: the earlier run in run.dir, whether it is replaced
    (``--overwrite``), later checkpoints a resume discards, the new run's disk estimate."""

    earlier: rundir.EarlierRun | None
    need: int | None
    replace: bool = False
    discard: list[str] = field(default_factory=list)
    logs: tuple[ClickLog, ClickLog | None] = None  # type: ignore[assignment]


@dataclass(frozen=True)
class _PassContext:
    client: Any
    group: CommGroup
    addresses: list[str]
    train_log: ClickLog
    plan: PassPlan
    shard_map: ShardMap


@dataclass
class _Prepared:
    """A pass ready to train: its keys and examples on their workers, maybe already staged."""

    spec: PassSpec
    keys: tuple[Any, ...]
    examples: tuple[Any, ...]
    position: int = 0  # in the run's schedule (over all epochs)
    staged: bool = False
    reports: list[StageReport] = field(default_factory=list)
    late: list[StageReport] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def stage_now(self, ctx: _PassContext, table: str) -> None:
        """Stage (or re-pin) the pass's keys; rows evicted since an early staging come back."""
        t = time.perf_counter()
        reports = stage_shards(ctx.client, ctx.addresses, table, self.keys)
        kill_point("stage", self.position)
        if self.staged:
            self.late = reports
        else:
            self.reports, self.staged = reports, True
        self.seconds["stage"] = self.seconds.get("stage", 0.0) + time.perf_counter() - t

    def staged_from(self) -> dict[str, int]:
        """Where the staged rows came from (re-pinning counts only rows fetched again)."""
        out = {
            "device": sum(r.from_device for r in self.reports),
            "host": sum(r.from_host for r in self.reports),
            "store": sum(r.from_store for r in self.reports),
            "init": sum(r.initialised for r in self.reports),
        }
        for r in self.late:
            out["host"] += r.from_host
            out["store"] += r.from_store
            out["init"] += r.initialised
        return {k: int(v) for k, v in out.items()}


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
        self._stores = Path(config.table.tiers.store_dir)  # the stores trained in
        self._aside: rundir.MovedAside | None = None  # an earlier run --overwrite replaces

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
        }

    def _start_cluster(self) -> ClusterHandle:
        return start_cluster(**self._cluster_args())

    def _comm_args(self) -> dict[str, Any]:
        """The keyword arguments of :func:`init_comm` (``cluster.dist_*``)."""
        c = self.config.cluster
        return {
            "backend": None if c.dist_backend == "auto" else c.dist_backend,
            "timeout_s": c.dist_timeout_s,
        }

    def _shard_host(self, spec: TableSpec, addresses: list[str]) -> ShardHost:
        """The worker plugin that holds every rank's shard of ``spec`` (the config's table) in
        ``self._stores``, tiered as ``table.tiers`` says."""
        cfg = self.config
        return ShardHost(
            [spec],
            self._stores,
            addresses,
            self._sizing(),
            policy=cfg.table.tiers.policy,  # type: ignore[arg-type]
            snapshot_every=cfg.table.tiers.snapshot_every,
            mode="a",
            commit=self._ckpt.commit if self._ckpt is not None else None,
        )

    def _train_setup(self) -> worker.TrainSetup:
        """What every rank builds its dense replica from (model, dense optimizer, schema)."""
        return worker.TrainSetup.from_config(self.config, self.run_id)

    def _plan(self, train_log: ClickLog, num_workers: int) -> PassPlan:
        return build_plan(
            train_log, self.config.passes.plan, num_workers, seed=self.config.run.seed
        )

    def _schedule(self, plan: PassPlan) -> list[tuple[int, PassSpec]]:
        """``(epoch, pass)`` in training order: every pass of the plan, ``passes.epochs`` times."""
        return [(epoch, spec) for epoch in range(self.config.passes.epochs) for spec in plan.passes]

    def _pass_info(self, spec: PassSpec, step: int, total_steps: int) -> dict[str, Any]:
        """What every rank's mini-batch loop gets for one pass: batch size and learning rates."""
        opt = self.config.dense_optimizer
        return {
            "batch_size": self.config.passes.plan.global_batch_size,
            "num_batches": spec.num_batches,
            "num_examples": spec.num_examples,
            "lr": [opt.lr * opt.lr_factor(step + b, total_steps) for b in range(spec.num_batches)],
        }

    def _holdout_batch_size(self, num_workers: int) -> int:
        """Holdout rows per evaluation step over all workers (``eval.batch_size`` each)."""
        return self.config.eval.batch_size * num_workers

    def _evaluates_each_pass(self, holdout: HoldoutStream | None) -> bool:
        return holdout is not None and self.config.eval.every_pass

    def _score(self, pred: np.ndarray, label: np.ndarray) -> dict[str, float]:
        return evaluate_predictions(pred, label, self.config.eval.metrics)

    def _sizing(self) -> TierSizing:
        tiers = self.config.table.tiers
        return TierSizing(
            device_fraction=tiers.device.fraction if tiers.device.rows is None else None,
            device_rows=tiers.device.rows,
            host_fraction=tiers.host.fraction or None,
        )

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
        logs = start.logs
        # -- from here on files change; an earlier run replaced by --overwrite stays aside
        # until the new run's first checkpoint, and comes back if the run fails before it.
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if start.replace and start.earlier is not None:
            self._aside = rundir.move_aside(start.earlier, start.need, cfg.source)
        try:
            for name in start.discard:
                # a warning, quiet or not: it removes a checkpoint the user may look for
                log.warning("discarding checkpoint %s: the run resumes from an earlier one", name)
                remove_checkpoint(checkpoints_dir(self.run_dir) / name)
            (self.run_dir / "config.yaml").write_text(cfg.to_yaml())
            if self._ckpt is not None:
                resuming.wait_for_stores(self._ckpt)  # the killed run's workers may still exit
            result = self._run_on_cluster(logs)
            (self.run_dir / "summary.json").write_text(json.dumps(self._summary(result), indent=2))
        except BaseException:
            if self._aside is not None:
                self._aside.restore()
            raise
        self._first_checkpoint_done()  # checkpoints off: the finished run replaces the old
        return result

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
            cfg.data.source, cfg.data.holdout, cfg.data.backend, cfg.data.block_size
        )
        return start

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
        result = RunResult(self.run_dir)
        with self._start_cluster() as handle:
            if handle.dashboard_link:
                self.echo(f"dashboard: {handle.dashboard_link}")
            addresses = list(handle.addresses)
            client = handle.client
            spec = cfg.table_spec()
            self._stores = self._stores_dir(len(addresses))
            host = self._shard_host(spec, addresses)
            group = init_comm(client, addresses, **self._comm_args())
            try:
                open_shards(client, host)
                self._train(client, group, addresses, logs, result)
            finally:
                # Stopped (Ctrl-C, an error): the rows changed since the last checkpoint are
                # dropped on purpose, a resume starts from it.
                stopped = sys.exc_info()[0] is not None
                try:
                    close_shards(client, addresses, "drop" if stopped else "warn")
                    client.run(remove_spill, self._stores / HOLDOUT_SPILL)
                finally:
                    group.close()
        return result

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
        _refuse_damaged_stores(ckpt)
        changes = resuming.check_resume(ckpt, self.config)
        accepted = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())
        self.echo(
            f"resuming from {ckpt.path} ({ckpt.passes_done} passes done)"
            + (f"; changed: {accepted}" if accepted else "")
        )
        return ckpt

    def _stores_dir(self, num_workers: int) -> Path:
        """The stores to train in: the config's for a new run, the checkpoint's on resume,
        re-sharded from the checkpoint's when the number of workers changed."""
        ckpt = self._ckpt
        if ckpt is None:
            return Path(self.config.table.tiers.store_dir)
        if ckpt.num_workers == num_workers:
            return ckpt.stores_dir
        out = resuming.resharded_dir(self.config.table.tiers.store_dir, ckpt, num_workers)
        self.echo(f"re-sharding {ckpt.name} from {ckpt.num_workers} to {num_workers} workers")
        return resuming.reshard(ckpt, num_workers, out)

    def _train(
        self,
        client: Any,
        group: CommGroup,
        addresses: list[str],
        logs: tuple[ClickLog, ClickLog | None],
        result: RunResult,
    ) -> None:
        cfg = self.config
        W = len(addresses)
        table = cfg.table.name
        train_log, holdout_log = logs
        # One streaming read of the log: good rows per partition (the plan's input), bad rows,
        # and the holdout written to the workers' disks. Nothing of the log stays in memory:
        # each pass reads its own partitions again when it is prepared.
        spill = self._stores / HOLDOUT_SPILL
        client.run(remove_spill, spill)  # a killed run's
        scan = scan_log(train_log, holdout_log, spill if holdout_log is not None else None)
        plan = build_plan(
            train_log,
            cfg.passes.plan,
            W,
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
            resuming.check_plan(ckpt, fingerprint)
        scan.report.log_summary(log)
        bad_by_pass = _bad_rows_by_pass(scan.report.by_shard(), plan)
        holdout = self._holdout(client, scan, addresses) if holdout_log is not None else None
        shard_map = ShardMap(cfg.passes.plan.num_shards, W)
        group.run(worker.setup_trainer, self._train_setup(), what="build dense replicas")
        schedule = self._schedule(plan)
        total_steps = sum(spec.num_batches for _, spec in schedule)
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
                self.run_id,
                ckpt.dense_state(),
                ckpt.optimizer_state(),
                ckpt.rng_states(),
                what="restore dense replicas",
            )
        if resumed:
            result.passes.extend(resuming.restore_metrics(metrics_path, done))
        else:
            metrics_path.write_text("")
        if self.eval_before and holdout is not None:
            result.initial_eval = self._evaluate(group, holdout)
        step = sum(spec.num_batches for _, spec in schedule[:done])
        days = sorted({m.group(1) for f in plan.files if (m := _DAY.search(f))})
        checkpointer = Checkpointer(
            cfg,
            self.run_dir,
            client,
            group,
            addresses,
            self.run_id,
            self._stores,
            days,
            fingerprint,
        )
        bar = tqdm(
            total=total_steps,
            initial=step,
            unit="batch",
            disable=not self.progress,
            desc="training",
        )
        batches = BatchProgress(client, self.run_id, bar) if self.progress else None
        ctx = _PassContext(client, group, addresses, train_log, plan, shard_map)
        # Pass k+1 is read, hashed, deduplicated, shuffled and staged on a driver thread while
        # pass k trains on the workers (Baidu's pipeline). That needs a second thread on every
        # worker: with one, a shuffle task of pass k+1 could hold a worker's only thread while
        # the other ranks wait for it inside a collective of pass k.
        pipelined = _min_threads(client, addresses) >= 2
        if not pipelined:
            log.warning(
                "workers have one thread each: pass k+1 is prepared after pass k instead of "
                "while it trains; give workers 2 threads (cluster.threads_per_worker) to overlap"
            )
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="daskhps-prepare")
        try:
            upcoming = (
                pool.submit(self._prepare, ctx, schedule[done][1], done)
                if done < len(schedule)
                else None
            )
            for i in range(done, len(schedule)):
                epoch, spec = schedule[i]
                assert upcoming is not None
                prepared = upcoming.result()
                if not prepared.staged:
                    prepared.stage_now(ctx, table)
                has_next = i + 1 < len(schedule)
                ahead = (
                    pool.submit(self._prepare, ctx, schedule[i + 1][1], i + 1)
                    if pipelined and has_next
                    else None
                )
                # Passes are numbered from 1 over the whole schedule, wherever a user reads them:
                # the bar, metrics.jsonl, the report, the dashboard, the checkpoint names.
                bar.set_description(f"pass {i + 1}/{len(schedule)}")
                announce_pass(client, addresses, i + 1)  # the dashboard's pass column
                if batches is not None:
                    batches.start_pass()
                rec = self._run_pass(ctx, prepared, step, total_steps, holdout, ahead)
                if has_next:
                    upcoming = ahead or pool.submit(self._prepare, ctx, schedule[i + 1][1], i + 1)
                # skipped rows are counted when their file is first read: in the first epoch
                skipped = bad_by_pass.get(spec.index, {}) if epoch == 0 else {}
                rec.update(epoch=epoch + 1, bad_rows_skipped=skipped)
                step += spec.num_batches
                if batches is not None:
                    batches.end_pass(spec.num_batches)
                else:
                    bar.update(spec.num_batches)
                bar.set_postfix(loss=f"{rec['train_loss']:.4f}", auc=rec.get("eval", {}).get("auc"))
                result.passes.append(rec)
                with metrics_path.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
                pos = Position(i + 1, len(schedule), epoch + 1, spec.index + 1, step)
                if checkpointer.due(pos):
                    checkpointer.take(pos, rec)
                    self._first_checkpoint_done()
        finally:
            if batches is not None:
                batches.close()
            bar.close()
            pool.shutdown(wait=True, cancel_futures=True)
        if not cfg.checkpoint.enabled:  # else the last checkpoint committed the final rows
            commit_shards(client, addresses, "end", {"passes": len(result.passes)})
        if result.passes:
            result.final_eval = result.passes[-1].get("eval", {})
        if holdout is not None and not result.final_eval:  # eval.every_pass off: at the end
            result.final_eval = self._evaluate(group, holdout)
        result.dense_state = group.run(worker.model_state, self.run_id, what="dense weights")[0]
        group.run(worker.drop_trainer, self.run_id, what="drop dense replicas")

    def _holdout(self, client: Any, scan: LogScan, addresses: list[str]) -> HoldoutStream | None:
        """The holdout the scan set aside, evaluated in chunks of at most a pass's size."""
        if not scan.holdout_rows:
            log.warning("the holdout has no rows: nothing is evaluated")
            return None
        bs = self._holdout_batch_size(len(addresses))
        chunk = max(self.config.passes.plan.examples_per_pass, bs)
        return HoldoutStream(client, scan.holdout, addresses, bs, chunk)

    def _prepare(self, ctx: _PassContext, spec: PassSpec, position: int) -> _Prepared:
        """Read the pass's partitions, route its keys to their owners and its examples to
        their workers, and try to stage the keys (pinned) while the previous pass may still
        hold its own pins."""
        cfg = self.config
        table = cfg.table.name
        t = time.perf_counter()
        # The pass's partitions, read, parsed and hashed once for both its keys and its
        # examples (held until both are placed, then released).
        where, lengths, offset = pass_partitions(ctx.plan.partition_lengths, spec.start, spec.stop)
        rows = dataclasses.replace(ctx.train_log, frame=ctx.train_log.frame.partitions[where])
        rows = dataclasses.replace(rows, frame=rows.frame.persist())
        start, stop = spec.start - offset, spec.stop - offset
        owned = owner_keys(
            pass_keys(rows, lengths, start, stop), ctx.shard_map, ctx.plan.config.shuffle_method
        )
        routed = route_examples(
            rows.frame,
            lengths,
            start,
            stop,
            batch_size=cfg.passes.plan.global_batch_size,
            num_workers=len(ctx.addresses),
            order=spec.order() - offset if spec.shuffled else None,
        )
        keys, examples = place_together(ctx.client, [owned, routed], ctx.addresses)
        del rows, owned, routed  # their graphs hold the read partitions: released with them
        prepared = _Prepared(spec, keys.futures, examples.futures, position)
        prepared.seconds["route"] = time.perf_counter() - t
        t = time.perf_counter()
        staged = try_stage_shards(ctx.client, ctx.addresses, table, keys.futures)
        if isinstance(staged, str):
            # Both working sets do not fit the device tier together: stage after the previous
            # pass unpins.
            log.debug("pass %d staged after the previous one: %s", spec.index, staged)
        else:
            prepared.reports, prepared.staged = staged, True
            kill_point("stage", position)
        prepared.seconds["stage_ahead"] = time.perf_counter() - t
        return prepared

    def _run_pass(
        self,
        ctx: _PassContext,
        prepared: _Prepared,
        step: int,
        total_steps: int,
        holdout: HoldoutStream | None,
        upcoming: Future[_Prepared] | None,
    ) -> dict[str, Any]:
        cfg = self.config
        table = cfg.table.name
        spec = prepared.spec
        info = self._pass_info(spec, step, total_steps)
        B = info["batch_size"]
        seconds = dict(prepared.seconds)
        t = time.perf_counter()
        disarm = kill_when_running(
            ctx.client, "daskhps-train-pass-", len(ctx.addresses), prepared.position
        )
        try:
            outs = ctx.group.run(
                worker.train_pass,
                self.run_id,
                info,
                rank_args=[(f,) for f in prepared.examples],
                what="train pass",
            )
        finally:
            disarm()
        seconds["train"] = train_s = time.perf_counter() - t
        t = time.perf_counter()
        if upcoming is not None:
            upcoming_pass = upcoming.result()  # its staging must not race the unpin
            run_pinned(ctx.client, ctx.addresses, _unpin, table, what="unpin")
            upcoming_pass.stage_now(ctx, table)  # re-pin what was staged ahead
        else:
            run_pinned(ctx.client, ctx.addresses, _unpin, table, what="unpin")
        seconds["unpin_repin"] = time.perf_counter() - t
        loss_sum = sum(o["loss_sum"] for o in outs)
        reports = prepared.reports
        rec: dict[str, Any] = {
            "pass": prepared.position + 1,  # in the run's schedule, from 1 (passes done after it)
            "pass_in_epoch": spec.index + 1,  # in the epoch's plan, from 1
            "examples": spec.num_examples,
            "examples_per_s": spec.num_examples / train_s if train_s else 0.0,
            "train_loss": loss_sum / spec.num_examples,
            "batch_losses": [
                sum(o["batch_loss_sums"][b] for o in outs) / min(B, spec.num_examples - b * B)
                for b in range(spec.num_batches)
            ],
            "rows_staged": int(sum(r.rows for r in reports)),
            "staged_from": prepared.staged_from(),
            "worker_seconds": {
                k: max(o["seconds"].get(k, 0.0) for o in outs) for k in outs[0]["seconds"]
            },
        }
        if self._evaluates_each_pass(holdout):
            assert holdout is not None
            t = time.perf_counter()
            rec["eval"] = self._evaluate(ctx.group, holdout)
            seconds["eval"] = time.perf_counter() - t
        stats = shard_stats(ctx.client, ctx.addresses)
        rec["tiers"] = _tier_summary(stats, table)
        rec["seconds"] = seconds
        return rec

    def _evaluate(self, group: CommGroup, holdout: HoldoutStream) -> dict[str, float]:
        def run_chunk(placed: Any) -> list[tuple[np.ndarray, np.ndarray]]:
            info = {"batch_size": holdout.batch_size, "num_batches": placed.num_batches}
            return group.run(
                worker.eval_pass,
                self.run_id,
                info,
                rank_args=[(f,) for f in placed.futures],
                what="eval holdout",
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
        }


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


_DAY = re.compile(r"day=(\d{4}-\d{2}-\d{2})")


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

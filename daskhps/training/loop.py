"""One attempt of a training run on its started process group: begin, pass after pass, end.

::

    begin: scan the log once ─► plan ─► a resume checked against it ─► dense replicas
           (restored on resume) ─► Start.settle (config.yaml, discards) ─► metrics.jsonl
    run:   for each pass of daskhps.training.pipeline.PassPipeline (prepared, activated):
             train on every rank (daskhps.training.worker.train_pass), synchronous;
               in the same call, [admit the new keys] first
             release, one call: count the keys seen, rows expire where a log day ends,
               unpin; then the next pass staged ahead is pinned again
             evaluate on the holdout (read-only lookups), tier figures ─► PassRecord
             (with the bytes between ranks, daskhps.monitor.network; each rank's on the
             dashboard) ─► metrics.jsonl line ─► checkpoint when due
    end:   final commit or evaluation, dense weights

A lost worker raises out of :meth:`PassLoop.run`; the trainer tears the group down and starts
another attempt (:mod:`daskhps.training.recovery`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from daskhps._scheduler import scheduler_workers
from daskhps._text import counted
from daskhps.config import RunConfig
from daskhps.data.readers import ClickLog
from daskhps.data.source import day_of
from daskhps.distributed import RunGroup, WorkerShards
from daskhps.errors import DataError, ResumeError
from daskhps.monitor.progress import PassProgress, Progress
from daskhps.monitor.worker_metrics import announce_network
from daskhps.passes import PassPlan, PassSpec, build_plan
from daskhps.passes.plan import bad_rows_by_pass, day_ends, warn_rereads
from daskhps.passes.scan import KeptReads, LogScan, remove_spill, scan_log
from daskhps.runfiles.checkpoint import Checkpoint, checkpoint_name, list_checkpoints
from daskhps.runfiles.replica import Replica
from daskhps.sharding import ShardMap
from daskhps.table.stats import NO_DAY
from daskhps.training import resume as resuming
from daskhps.training import worker
from daskhps.training.checkpointer import Checkpointer, Position
from daskhps.training.holdout import HoldoutStream
from daskhps.training.killpoints import kill_when_running
from daskhps.training.parts import RunParts
from daskhps.training.pipeline import PassContext, PassPipeline, PreparedPass
from daskhps.training.records import (
    Batches,
    KeyAdmission,
    PassRecord,
    RankPassResult,
    RunResult,
    tier_summary,
)
from daskhps.training.watch import ModelWatch, diverged_line

__all__ = ["HOLDOUT_SPILL", "PassLoop"]

HOLDOUT_SPILL = ".holdout"  # in the stores' folder (worker-local): the holdout's parts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Begun:
    """What the passes of a run start from (:meth:`PassLoop._begin`)."""

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


class PassLoop:
    """The passes of one attempt of a run of ``config`` in ``stores``.

    ``ckpt`` is what the attempt continues from: a resume's checkpoint (its plan continues),
    or with ``warm_start`` a warm start's (a new plan from pass 0); None for a new run.
    ``settle`` is called once the checks that need the cluster passed, ``on_checkpoint``
    after each checkpoint.
    """

    def __init__(
        self,
        config: RunConfig,
        parts: RunParts,
        stores: Path,
        ckpt: Checkpoint | None,
        *,
        warm_start: bool,
        eval_before: bool,
        progress: Progress,
        replica: Replica | None,
        settle: Callable[[], None],
        on_checkpoint: Callable[[], None],
    ) -> None:
        self.config = config
        self.parts = parts
        self.run_dir = Path(config.run.dir)
        self.stores = stores
        self.ckpt = ckpt
        self.warm_start = warm_start
        self.eval_before = eval_before
        self.progress = progress
        self.replica = replica
        self.settle = settle
        self.on_checkpoint = on_checkpoint
        self._kept = KeptReads()  # what the planning scan kept parsed (the first pass's)

    def run(
        self, group: RunGroup, logs: tuple[ClickLog, ClickLog | None], result: RunResult
    ) -> None:
        """Every pass of the schedule not done yet, through the pass pipeline."""
        try:
            self._run(group, logs, result)
        finally:
            # A failure before the first pass was placed must not leave its parsed partitions
            # wanted: while a recovery waits for workers, Dask would read a lost worker's
            # again on the others.
            self._kept.release()

    def _run(
        self, group: RunGroup, logs: tuple[ClickLog, ClickLog | None], result: RunResult
    ) -> None:
        cfg = self.config
        client, addresses = group.client, list(group.addresses)
        begun = self._begin(group, logs, result)
        ctx = PassContext(
            group,
            logs[0],
            begun.plan,
            ShardMap(cfg.passes.plan.num_shards, len(addresses)),
            None if cfg.several_tables else cfg.table_specs()[0].name,
            cfg.passes.plan.global_batch_size,
            self._kept,
        )
        checkpointer = self._checkpointer(group, begun)
        last_day = [span[1] if span else None for span in begun.plan.pass_days()]
        progress = PassProgress(
            client,
            self.parts.run_id,
            addresses,
            total_passes=len(begun.schedule),
            total_batches=begun.total_steps,
            batches_done=begun.step,
            show=self.progress,
        )
        specs = [spec for _, spec in begun.schedule]
        step = begun.step
        watch = self._watch(result.passes)
        admits = any(not t.admission_rule.admits_all for t in cfg.embedding_tables())
        admit = KeyAdmission(ctx.table, admits)
        with progress, PassPipeline(ctx, specs, begun.done, _overlaps(client, addresses)) as pipe:
            for active in pipe:
                progress.start_pass(active.position + 1)
                epoch = begun.schedule[active.position][0]
                rec = self._train_pass(ctx, active, admit, step, begun.total_steps)
                released = pipe.release(active, begun.day_ends.get(active.position))
                rec.seconds["count"] = released.count_s
                if released.expiry:  # a log day ended: rows expired
                    rec.expiry = released.expiry
                    rec.seconds["expire"] = released.expire_s
                rec.seconds["unpin_repin"] = released.unpin_repin_s
                checkpointer.note_lifecycle(rec, last_day[active.spec.index])
                self._finish_record(ctx, rec, begun, active.spec, epoch)
                announce_network(client, addresses, rec.network)  # dashboard, /metrics
                step += active.spec.num_batches
                progress.end_pass(active.spec.num_batches, rec.train_loss, rec.auc)
                result.passes.append(line := rec.to_json())
                with begun.metrics_path.open("a") as f:
                    f.write(json.dumps(line) + "\n")
                pos = Position(
                    active.position + 1, len(specs), epoch + 1, active.spec.index + 1, step
                )
                if self._judged(watch, checkpointer, pos, rec, result):
                    break
        result.model = watch.best.to_json() if watch.best is not None else None
        self._end(group, begun.holdout, result)

    def _checkpointer(self, group: RunGroup, begun: _Begun) -> Checkpointer:
        """The run's checkpointer; a resume's copy caught up, its days' figures carried on."""
        checkpointer = Checkpointer(
            self.config,
            self.run_dir,
            group,
            self.stores,
            begun.days,
            begun.fingerprint,
            self.replica,
        )
        ckpt = self.ckpt
        if (
            checkpointer.replica is not None
            and ckpt is not None
            and not self.warm_start
            and ckpt.stores_dir == self.stores  # not re-sharded: these stores are its
            and not checkpointer.replica.has_checkpoint(ckpt.name)
        ):
            checkpointer.replicate(ckpt)  # a copy that failed or began with this resume
        if ckpt is not None and not self.warm_start:  # a resume: the days so far
            checkpointer.lifecycle = {d: dict(v) for d, v in ckpt.lifecycle.items()}
        return checkpointer

    def _judged(
        self,
        watch: ModelWatch,
        checkpointer: Checkpointer,
        pos: Position,
        rec: PassRecord,
        result: RunResult,
    ) -> bool:
        """What the holdout says of the pass just done (:mod:`daskhps.training.watch`): a
        checkpoint when due, naming the run's model; whether the run stops here."""
        stop = watch.observe(pos.passes_done, rec.train_loss, rec.eval)
        if stop is not None and stop.kind == "diverged":
            # this pass's rows are never a checkpoint; the line names the levers
            line = diverged_line(self.config, stop, watch.best)
            result.stopped = {**stop.to_json(), "line": line}
            log.warning("diverged at pass %d: %s", pos.passes_done, stop.why)
            return True
        if checkpointer.due(pos) or stop is not None:  # stopped early: its last pass too
            name = checkpoint_name(pos.passes_done)
            best = watch.checkpointed(name, pos.passes_done, rec.eval)
            checkpointer.take(pos, rec, best, stop)
            self.on_checkpoint()
        if stop is not None:
            result.stopped = stop.to_json()
            log.warning("stopped early after pass %d: %s", pos.passes_done, stop.why)
        return stop is not None

    def _watch(self, passes: list[dict[str, Any]]) -> ModelWatch:
        """The holdout's watch over this run: a resume's rebuilt from the passes done and the
        checkpoints kept (the run's best among them); a warm start's starts afresh."""
        rule, ckpt = self.config.eval, self.ckpt
        if ckpt is None or self.warm_start:
            return ModelWatch(rule)
        kept = [c for c in list_checkpoints(self.run_dir) if c.passes_done <= ckpt.passes_done]
        return ModelWatch.resumed(rule, passes, [(c.name, c.passes_done, c.metrics) for c in kept])

    def _begin(
        self, group: RunGroup, logs: tuple[ClickLog, ClickLog | None], result: RunResult
    ) -> _Begun:
        """Scan the log, plan its passes, check a resume against them, build (and restore)
        the dense replicas, and start (or restore) ``metrics.jsonl``."""
        client, addresses = group.client, list(group.addresses)
        scan, plan = self._scan_and_plan(group, logs)
        fingerprint = resuming.plan_fingerprint(
            plan.files, plan.partition_lengths, len(plan.passes)
        )
        ckpt = self.ckpt
        resumed = self._resumes  # else a new plan from pass 0
        if resumed:
            assert ckpt is not None
            relative = [os.path.relpath(f) for f in plan.files]
            spelled = resuming.plan_fingerprint(relative, plan.partition_lengths, len(plan.passes))
            resuming.check_plan(ckpt, fingerprint, spelled)
        scan.report.log_summary(log)
        holdout = self._holdout(client, scan, addresses) if logs[1] is not None else None
        group.run(worker.setup_trainer, self.parts.train_setup(), what="build dense replicas")
        schedule = self.parts.schedule(plan)
        done = ckpt.passes_done if ckpt is not None and resumed else 0
        # what the scan kept beyond the first pass goes (one max_working_set cut short)
        first = schedule[done][1] if done < len(schedule) else None
        scan.kept.keep_only(plan.partition_lengths, *(first.start, first.stop) if first else (0, 0))
        metrics_path = self.run_dir / "metrics.jsonl"
        if ckpt is not None:
            if resumed and done > len(schedule):
                raise ResumeError(
                    f"cannot resume from {ckpt.path}: it is {counted(done, 'pass', 'passes')} "
                    "in, but the config "
                    f"schedules {len(schedule)}; keep passes.epochs >= {ckpt.config.passes.epochs}"
                )
            group.run(
                worker.load_dense_checkpoint,
                ckpt.dense_state(),
                ckpt.optimizer_state(),
                ckpt.rng_states(),
                what="restore dense replicas",
            )
        self.settle()  # every refusal is behind: the run's files may change now
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
            bad_by_pass=bad_rows_by_pass(scan.report.by_shard(), plan),
            fingerprint=fingerprint,
            days=sorted({d for f in plan.files if (d := day_of(f)) is not None}),
            metrics_path=metrics_path,
            day_ends=self._day_ends(plan, schedule),
        )

    @property
    def _resumes(self) -> bool:
        """Whether the attempt continues a resume's plan (not a new one from pass 0)."""
        return self.ckpt is not None and not self.warm_start

    def _scan_and_plan(
        self, group: RunGroup, logs: tuple[ClickLog, ClickLog | None]
    ) -> tuple[LogScan, PassPlan]:
        """One streaming read of the log: good rows per partition (the plan's input), bad
        rows, and the holdout written to the workers' disks; then the plan. Of the log, only
        the partitions of a new plan's first pass stay in memory (it starts at position 0 and
        holds at most examples_per_pass); every later pass reads its own partitions again
        when it is prepared."""
        cfg = self.config
        train_log, holdout_log = logs
        spill = self.stores / HOLDOUT_SPILL
        group.client.run(remove_spill, spill)  # a killed run's
        scan = scan_log(
            train_log,
            holdout_log,
            spill if holdout_log is not None else None,
            keep=None if self._resumes else (0, cfg.passes.plan.examples_per_pass),
        )
        self._kept = scan.kept
        self._refuse_empty(scan, train_log)
        plan = build_plan(
            train_log,
            cfg.passes.plan,
            len(group.addresses),
            seed=cfg.run.seed,
            partition_lengths=scan.lengths,
        )
        warn_rereads(plan, cfg.data.block_size)
        return scan, plan

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
        rules = [t.expiry for t in self.config.embedding_tables()]
        if all(e.ttl_days is None and e.max_rows is None for e in rules):
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
        bs = self.parts.holdout_batch_size(len(addresses))
        chunk = max(self.config.passes.plan.examples_per_pass, bs)
        return HoldoutStream(client, scan.holdout, addresses, bs, chunk)

    def _train_pass(
        self,
        ctx: PassContext,
        active: PreparedPass,
        admit: KeyAdmission,
        step: int,
        total_steps: int,
    ) -> PassRecord:
        """Train an activated pass on every rank (its new keys admitted first as ``admit``
        says); its record, without evaluation or tiers."""
        spec = active.spec
        batches = self.parts.batches(spec, step, total_steps)
        t = time.perf_counter()
        disarm = kill_when_running(
            ctx.group.client, "daskhps-train-pass-", ctx.group.world_size, active.position
        )
        try:
            outs: list[RankPassResult] = ctx.group.run(
                worker.train_pass,
                batches,
                active.position,
                admit,
                rank_args=list(zip(active.examples, active.keys, strict=True)),
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
        rec.seconds = {**active.seconds, **rec.seconds}  # staging's, then the call's
        return rec

    def _finish_record(
        self, ctx: PassContext, rec: PassRecord, begun: _Begun, spec: PassSpec, epoch: int
    ) -> None:
        """Evaluate (``eval.every_pass``), take the tiers' figures (after the release) and the
        bad rows skipped (counted when their file is first read: in the first epoch)."""
        if self.parts.evaluates_each_pass(begun.holdout):
            assert begun.holdout is not None
            t = time.perf_counter()
            rec.eval = self._evaluate(ctx.group, begun.holdout)
            rec.seconds["eval"] = time.perf_counter() - t
        stats = ctx.group.on_shards(WorkerShards.stats, what="shard stats")
        tables = [t.name for t in self.config.embedding_tables()]
        rec.tiers = tier_summary(stats, tables)
        if rec.admission:  # the keys waiting for admission after this pass, and their bytes
            pending = [s["tables"][t]["pending"] for s in stats for t in tables]
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

        return self.parts.score(*holdout.evaluate(run_chunk))


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

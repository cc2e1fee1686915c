"""One scheduled retraining run, a rollback, and the version listing.

::

    lock <run.dir>/retrain.lock ──(held)──► exit 5 LOCKED
      [data.generate: generate its days unless there]
      scan day=*/ folders ─► plan_days ──(no new complete day)──► exit 3 NOTHING_NEW
      train candidate from CURRENT (attempts/<id>/), score both on the newest day
      guard ──(fails)──► record the attempt, CURRENT unchanged ──► exit 4 REJECTED
            ──(holds)──► registry.json + CURRENT (atomic) ──────► exit 0 PUBLISHED

Every outcome is an :class:`Outcome` with its exit code and a message that says what happened
and why; errors raise (the pipeline turns them into exit codes 1 and 2).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from daskhps.config import RunConfig
from daskhps.distributed.cluster import KeptCluster
from daskhps.errors import ConfigError
from daskhps.monitor.progress import Progress
from daskhps.retrain.codes import ExitCode
from daskhps.retrain.days import Day, DayPlan, plan_days, scan_days
from daskhps.retrain.errors import UnknownVersionError, VersionNotFoundError
from daskhps.retrain.guard import Verdict, judge
from daskhps.retrain.lock import RetrainLock
from daskhps.retrain.publish import freeze_version
from daskhps.retrain.retention import after_publish
from daskhps.retrain.stores import Disks, missing_commit
from daskhps.retrain.versions import Attempt, Registry, Version
from daskhps.retrain.versions import Outcome as AttemptOutcome
from daskhps.training.killpoints import kill_point

if TYPE_CHECKING:
    from daskhps.retrain.candidate import Candidate

__all__ = [
    "Outcome",
    "check_current",
    "describe_versions",
    "new_attempt_id",
    "publish_candidate",
    "refuse_training_run",
    "registry_of",
    "retrain",
    "rollback",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What a run did: its exit code, a message for the log, the version now current."""

    code: ExitCode
    message: str
    current: Version | None = None
    plan: DayPlan | None = None


def registry_of(config: RunConfig) -> Registry:
    """The version registry of ``config``'s run directory (``<run.dir>/versions``)."""
    return Registry(Path(config.run.dir) / "versions")


def new_attempt_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"


def _fmt(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k} {metrics[k]:.5f}" for k in ("auc", "logloss") if k in metrics)


def _days(config: RunConfig, dry_run: bool, progress: bool) -> list[Day]:
    """The day partitions of the run's logs: ``data.train.paths``, or ``data.generate.out``
    once its days are generated there (as ``train`` does; a dry run writes nothing and counts
    the days it would generate as complete)."""
    gen = config.data.generate
    if gen is None:
        assert config.data.train is not None
        return scan_days(list(config.data.train.paths))
    if dry_run and not gen.ready():
        return [Day(day, (), True) for day in gen.generator.day_names()]
    gen.ensure(progress=progress)
    wanted = set(gen.generator.day_names())  # not days of a longer generation before
    return [d for d in scan_days([gen.out]) if d.day in wanted]


def refuse_training_run(run_dir: Path, source: str) -> None:
    """:class:`ConfigError` when ``run_dir`` holds a training run (``daskhps train`` made it):
    publishing versions there would hide its own checkpoints from ``predict`` and ``serve``
    and stop its ``--resume``."""
    from daskhps.runfiles.published import registry_folder
    from daskhps.runfiles.rundir import training_run_files

    found = training_run_files(run_dir)
    if found and registry_folder(run_dir) is None:
        raise ConfigError(
            f"{source}: run.dir {run_dir} holds a training run ({', '.join(found)}), made by "
            "daskhps train; daskhps retrain never writes there: continue it with `daskhps "
            f"train {source} --resume`, or give retraining a folder of its own (set run.dir)"
        )


def retrain(
    config: RunConfig,
    *,
    echo: Callable[[str], None] | None = None,
    progress: Progress | None = None,
    dry_run: bool = False,
) -> Outcome:
    """Train on the new complete days and publish the candidate if the guard holds.

    The days come from ``data.train.paths``, or from ``data.generate`` (generated first, as
    ``daskhps train`` does; raise ``data.generate.days`` to add one). ``dry_run`` stops after
    choosing the days (exit code 0 when there is work, 3 when not).
    """
    say = echo or (lambda message: log.info("%s", message))
    run_dir = Path(config.run.dir)
    refuse_training_run(run_dir, config.source)
    with RetrainLock(run_dir):
        registry = registry_of(config)
        current = check_current(registry, config)  # before any day is generated or recorded
        shown = (not config.run.quiet) if progress is None else progress is True
        days = _days(config, dry_run, shown)
        plan = plan_days(
            days, current.trained_through if current else None, registry.seen_through()
        )
        if not plan.has_work:
            return Outcome(ExitCode.NOTHING_NEW, f"nothing to do: {plan.reason}", current, plan)
        what = _intent(plan, current)
        if dry_run:
            return Outcome(ExitCode.PUBLISHED, f"would {what}", current, plan)
        say(f"retrain: {what}")
        attempt_id = new_attempt_id()
        assert plan.eval_day is not None  # a plan with work has a day to score on
        run = _Run(
            config,
            registry,
            current,
            plan,
            plan.eval_day,
            attempt_id,
            run_dir / "attempts" / attempt_id,
        )
        # The candidate's cluster stays up until the run ends: publishing and retention run
        # on the workers whose disks hold the stores.
        with KeptCluster() as cluster:
            cand = _train(run, echo, progress, cluster)
            verdict = judge(cand.metrics, cand.baseline, config.retrain, run.baseline_name)
            if cand.diverged is not None:  # whatever its best scored: its training broke
                verdict = Verdict(False, failed=(f"the candidate diverged: {cand.diverged}",))
            attempt = _judged_attempt(run, cand, verdict)
            if not verdict.publish:
                return _reject(run, cand, verdict, attempt)
            client = cluster.handle.client if cluster.handle is not None else None
            return _publish(run, cand, verdict, attempt, Disks(client, config.source))


@dataclass(frozen=True)
class _Run:
    """One retraining attempt under way: what it trains from and on, and where."""

    config: RunConfig
    registry: Registry
    current: Version | None
    plan: DayPlan
    eval_day: str
    attempt_id: str
    attempt_dir: Path

    @property
    def base(self) -> str | None:
        return self.current.name if self.current else None

    @property
    def baseline_name(self) -> str:
        return f"published {self.current.name}" if self.current else "untrained model"

    def attempt(self, outcome: AttemptOutcome, **fields: Any) -> Attempt:
        """The registry's record of this attempt."""
        return Attempt(
            self.attempt_id,
            self.base,
            self.plan.train,
            self.eval_day,
            outcome,
            time=time.time(),
            **fields,
        )


def check_current(registry: Registry, config: RunConfig) -> Version | None:
    """The current version, once ``config`` is known to warm-start from it (a refused
    config raises here)."""
    current = registry.current()
    if current is not None:
        from daskhps.retrain.candidate import check_warm_start
        from daskhps.runfiles.checkpoint import load_checkpoint

        check_warm_start(load_checkpoint(current.checkpoint), config)
    return current


def _intent(plan: DayPlan, current: Version | None) -> str:
    """What the run will do, for the log (and a dry run's message)."""
    base = f"version {current.name}" if current else "scratch (nothing published yet)"
    ignored = f"; ignored: {', '.join(plan.ignored)}" if plan.ignored else ""
    return f"train on {', '.join(plan.train)} from {base}; score on {plan.eval_day}{ignored}"


def _train(
    run: _Run,
    echo: Callable[[str], None] | None,
    progress: Progress | None,
    cluster: KeptCluster,
) -> Candidate:
    """The trained candidate (on ``cluster``, kept up after it); a failure is recorded as a
    failed attempt, then raised."""
    from daskhps.retrain.candidate import day_data, train_candidate

    try:
        return train_candidate(
            run.config,
            day_data(run.config, run.plan),
            run.attempt_dir,
            run.current.checkpoint if run.current else None,
            echo=echo,
            progress=progress,
            cluster=cluster,
        )
    except Exception as e:
        run.registry.record(run.attempt("failed", reasons=(f"{type(e).__name__}: {e}",)))
        raise


def _judged_attempt(run: _Run, cand: Candidate, verdict: Verdict) -> Attempt:
    return run.attempt(
        "published" if verdict.publish else "rejected",
        reasons=verdict.failed if not verdict.publish else verdict.passed,
        metrics=cand.metrics,
        baseline=cand.baseline,
    )


def _scores(run: _Run, cand: Candidate) -> str:
    return (
        f"on {run.eval_day}: candidate {_fmt(cand.metrics)}; "
        f"{run.baseline_name} {_fmt(cand.baseline)}"
    )


def _reject(run: _Run, cand: Candidate, verdict: Verdict, attempt: Attempt) -> Outcome:
    """Record the rejected attempt; CURRENT stays as it is."""
    run.registry.record(attempt)
    keep = f"{run.current.name} stays current" if run.current else "nothing is published"
    return Outcome(
        ExitCode.REJECTED,
        f"candidate rejected ({verdict.explain()}); {keep}. Scores {_scores(run, cand)}. "
        f"The next run trains on {run.eval_day} too. Candidate kept in {run.attempt_dir}",
        run.current,
        run.plan,
    )


def _publish(
    run: _Run, cand: Candidate, verdict: Verdict, attempt: Attempt, disks: Disks
) -> Outcome:
    """Freeze the candidate as the next version, make it current, then apply
    ``retrain.keep_versions``; the stores change on ``disks``, where they lie."""
    version, removed = publish_candidate(
        run.registry,
        cand,
        attempt,
        disks,
        run.config.retrain.keep_versions,
        parent=run.base,
        train_days=run.plan.train,
        trained_through=run.plan.train[-1],
        eval_day=run.eval_day,
    )
    return Outcome(
        ExitCode.PUBLISHED,
        f"published {version.name} ({verdict.explain()}). Scores {_scores(run, cand)}. "
        f"Checkpoint {version.checkpoint}.{removed}",
        version,
        run.plan,
    )


def publish_candidate(
    registry: Registry,
    cand: Candidate,
    attempt: Attempt,
    disks: Disks,
    keep: int | None,
    position: int = 0,
    **fields: Any,
) -> tuple[Version, str]:
    """Freeze ``cand`` as the registry's next version (``fields``: what it trained on, its
    parent), make it current, then apply ``keep`` (``retrain.keep_versions``); the version,
    and a sentence naming the versions removed ("" when none). ``position``: the candidate's
    among those of this process, for the kill points."""
    name = registry.next_name()
    frozen = freeze_version(cand.checkpoint, registry.folder / name, name, disks)
    kill_point("publish_frozen", position)
    version = Version(
        name=name,
        checkpoint=str(frozen.path.resolve()),  # readers may start in another folder
        commit=frozen.commit,
        stores_dir=str(frozen.stores_dir),
        metrics=cand.metrics,
        baseline=cand.baseline,
        created=time.time(),
        **fields,
    )
    registry.publish(version, dataclasses.replace(attempt, version=version.name))
    kill_point("published", position)
    removed = after_publish(registry, keep, disks)
    gone = f" Removed {', '.join(removed)} (retrain.keep_versions: {keep})." if removed else ""
    return version, gone


def _check_restorable(version: Version, config: RunConfig) -> None:
    """Raise unless the version's checkpoint loads and every rank store holds its commit,
    asked of the disks that hold them: a cluster's workers (``cluster.address``: each has its
    own), or this machine's, which the embedded cluster's workers share."""
    from daskhps.runfiles.checkpoint import load_checkpoint
    from daskhps.training.parts import RunParts

    ckpt = load_checkpoint(version.checkpoint)
    if config.cluster.local:
        missing = missing_commit(Disks(), ckpt)
    else:
        with RunParts(config, f"rollback-{version.name}").start_cluster() as handle:
            missing = missing_commit(Disks(handle.client, config.source), ckpt)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise VersionNotFoundError(
            f"version {version.name}: commit {version.commit!r} is gone from {missing[0]}{more}, "
            "dropped or compacted away, or its host is gone; choose another version"
        )


def rollback(config: RunConfig, name: str) -> Outcome:
    """Make the published version ``name`` current again (under the run's lock)."""
    with RetrainLock(Path(config.run.dir)):
        registry = registry_of(config)
        target = registry.get(name)
        if registry.removed(name):
            raise UnknownVersionError(
                f"version {name} was removed by retrain.keep_versions (its folder and its "
                "commit are gone); choose a version `--versions` lists"
            )
        _check_restorable(target, config)
        previous, now = registry.rollback(name)
        was = previous.name if previous else "none"
        return Outcome(
            ExitCode.PUBLISHED,
            f"CURRENT is now {now.name} (was {was}); the next run trains from it on the "
            f"complete days after {now.trained_through}, once a day newer than "
            f"{registry.seen_through() or now.eval_day} is complete",
            now,
        )


def describe_versions(config: RunConfig) -> str:
    """The published versions and the recent attempts, as a text table."""
    from daskhps.retrain.listing import describe_registry

    return describe_registry(registry_of(config))

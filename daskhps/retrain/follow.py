"""Continuous training: ``daskhps retrain CONFIG --follow``.

One long-running process per run folder that trains each new complete chunk of the logs
(:mod:`daskhps.retrain.chunks`) into a new published version, on a cluster it keeps::

    lock <run.dir>/retrain.lock ──(held: another follower or run)──────────► exit 5 LOCKED
    start the cluster once; then, every retrain.poll_seconds:
      list the complete chunks; leave out every file an earlier attempt took
      (a listing that fails: said, retried with backoff, the lag grows)
      for the oldest new chunk:
        score the published version on it (progressive validation: not seen yet)
        train the candidate from the published version on it
        diverged (eval.diverge_factor, NaN) ─► recorded as rejected, CURRENT unchanged
        else ─► versions/<v>/ + registry.json (the chunk, its files) + CURRENT
    SIGTERM or Ctrl-C: the chunk in hand is finished and published, then exit 0;
    a second one abandons it (nothing published; the next follower trains it) ──► exit 0

Exactly once: a chunk's files are recorded in the registry with the attempt that trained
them, in the same atomic write that publishes its version. A follower killed at any moment
leaves the registry as it was before that chunk, and the next follower trains the chunk
again from the same version: each version is a function of its parent and its chunk, so the
model equals the one an uninterrupted follower makes from the same chunks in the same order.

While it runs, ``<run.dir>/follow.json`` and the process's Prometheus registry (the embedded
cluster's ``/metrics``) say how far behind the logs it is
(:mod:`daskhps.retrain.follow_status`); :mod:`daskhps.retrain.stopping` stops it.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daskhps import storage
from daskhps.config import RunConfig
from daskhps.data.source import day_of
from daskhps.distributed.cluster import KeptCluster, start_cluster
from daskhps.distributed.configured import cluster_args
from daskhps.errors import CheckpointError, DataError, StorageError
from daskhps.monitor.progress import Progress
from daskhps.retrain.candidate import Candidate
from daskhps.retrain.chunks import Chunk, list_chunks, new_chunks
from daskhps.retrain.codes import ExitCode
from daskhps.retrain.follow_status import FollowStatus, exported
from daskhps.retrain.job import (
    Outcome,
    check_current,
    new_attempt_id,
    publish_candidate,
    refuse_training_run,
    registry_of,
)
from daskhps.retrain.lock import RetrainLock
from daskhps.retrain.stopping import StopRequest
from daskhps.retrain.stores import Disks
from daskhps.retrain.versions import Attempt, Registry, Version
from daskhps.retrain.versions import Outcome as AttemptOutcome
from daskhps.training.killpoints import check_env, kill_point

__all__ = ["follow"]

log = logging.getLogger(__name__)

_BACKOFF_MAX_S = 60.0  # the longest wait between listings of logs that cannot be listed


def _logs(config: RunConfig, progress: bool) -> tuple[tuple[str, ...], bool]:
    """The watched paths and whether their files wait for a ``_SUCCESS`` marker; generated
    logs (``data.generate``) are generated first, as ``daskhps train`` does."""
    if config.data.train is not None:
        return config.data.train.paths, config.data.train.require_complete
    gen = config.data.generate
    assert gen is not None  # a config has exactly one of train and generate
    gen.ensure(progress=progress)
    return (gen.out,), True


def _landed(files: tuple[str, ...]) -> float:
    """When the newest of ``files`` landed: its modification time (now where unknown)."""
    newest = 0.0
    for f in files:
        try:
            if storage.is_url(f):
                info = storage.filesystem(f)[0].info(f)
                m = info.get("mtime") or info.get("LastModified") or info.get("last_modified")
                stamp = m.timestamp() if hasattr(m, "timestamp") else float(m or 0.0)
            else:  # a rename into place changes the ctime, not the mtime
                st = os.stat(f)
                stamp = max(st.st_mtime, st.st_ctime)
        except (OSError, ValueError, TypeError):
            stamp = time.time()
        newest = max(newest, stamp)
    return newest


def _finite(metrics: dict[str, float]) -> bool:
    return all(math.isfinite(v) for k, v in metrics.items() if k in ("auc", "logloss"))


@dataclass(frozen=True)
class _Step:
    """One chunk's attempt: the chunk, the version it trains from, its folder."""

    chunk: Chunk
    current: Version | None
    attempt_id: str
    attempt_dir: Path
    landed: float  # when the chunk's newest file landed

    @property
    def days(self) -> tuple[str, ...]:
        return tuple(sorted({d for f in self.chunk.files if (d := day_of(f)) is not None}))

    @property
    def base(self) -> str | None:
        return self.current.name if self.current else None

    @property
    def kept(self) -> str:
        """What stays current when this step publishes nothing."""
        return f"{self.base} stays current" if self.base else "nothing is published"

    def attempt(self, outcome: AttemptOutcome, **fields: Any) -> Attempt:
        """The registry's record of this step."""
        return Attempt(
            self.attempt_id,
            self.base,
            self.days,
            "",
            outcome,
            time=time.time(),
            chunk=self.chunk.name,
            files=self.chunk.files,
            **fields,
        )


@dataclass
class _Follower:
    """One ``--follow`` run: its registry, its kept cluster, what it has said of its lag."""

    config: RunConfig
    registry: Registry
    cluster: KeptCluster
    status: FollowStatus
    stop: StopRequest
    say: Callable[[str], None]
    echo: Callable[[str], None] | None
    progress: Progress | None
    backoff: float = 0.0

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run.dir)

    def run(self, paths: tuple[str, ...], require_complete: bool, max_chunks: int | None) -> None:
        """List, train the oldest new chunk, again, until stopped or ``max_chunks`` are done."""
        poll = self.config.retrain.poll_seconds
        status = self.status
        self.backoff = poll
        while not self.stop.requested and (max_chunks is None or status.trained < max_chunks):
            try:
                taken = self.registry.taken_files()
                fresh = new_chunks(list_chunks(paths, require_complete), taken)
            except StorageError as e:
                self._out_of_reach("listing the logs", e)
                continue
            status.listing_error, status.listed, status.waiting = None, time.time(), len(fresh)
            status.write(self.run_dir)
            if not fresh:
                self.backoff = poll
                self.stop.wait(poll)
                continue
            kill_point("follow_listed", status.trained)
            try:
                self.train(fresh[0])
            except StorageError as e:  # recorded as failed: the chunk is taken again
                self._out_of_reach(f"reading {fresh[0].name}", e)
                continue
            except KeyboardInterrupt:
                self.say(
                    f"follow: abandoned {fresh[0].name}: nothing of it was published; the "
                    "next follower trains it"
                )
                return
            self.backoff = poll
            status.trained += 1
            status.waiting = len(fresh) - 1
            status.write(self.run_dir)

    def _out_of_reach(self, what: str, e: StorageError) -> None:
        """The logs' store cannot be reached: say so, wait longer each time."""
        self.status.listing_error = str(e)
        self.status.write(self.run_dir)
        self.say(
            f"follow: {what} failed ({e}); trying again in {self.backoff:g} s, "
            f"{self.status.lag_seconds():.0f} s behind the newest trained chunk"
        )
        self.stop.wait(self.backoff)
        self.backoff = min(self.backoff * 2, _BACKOFF_MAX_S)

    def train(self, chunk: Chunk) -> Version | None:
        """Train ``chunk`` from the current version; the version published (None: none)."""
        attempt_id = new_attempt_id()
        step = _Step(
            chunk,
            check_current(self.registry, self.config),
            attempt_id,
            self.run_dir / "attempts" / attempt_id,
            _landed(chunk.files),
        )
        cand = self._candidate(step)
        if cand is None:
            return None
        self.status.progressive = dict(cand.baseline)
        why: str | None = cand.diverged
        if why is None and not _finite(cand.metrics):
            why = "its metrics are not numbers"
        if why is not None:
            reasons = (f"the candidate diverged: {why}",)
            self.registry.record(step.attempt("rejected", reasons=reasons, **_both(cand)))
            self.say(
                f"follow: {chunk.name}: candidate rejected ({why}); {step.kept}. "
                f"{_scores(cand.baseline, cand.metrics)}"
            )
            return None
        return self._publish(step, cand)

    def _candidate(self, step: _Step) -> Candidate | None:
        """The step's trained candidate; None when the chunk has no rows to train on (said
        and recorded). Other failures are recorded, then raised."""
        from daskhps.retrain.candidate import chunk_data, train_candidate

        current, chunk = step.current, step.chunk
        try:
            return train_candidate(
                self.config,
                chunk_data(self.config, chunk.files),
                step.attempt_dir,
                current.checkpoint if current else None,
                echo=self.echo,
                progress=self.progress,
                cluster=self.cluster,
            )
        except (DataError, FileNotFoundError) as e:  # this chunk's rows: skip it, go on
            self.registry.record(step.attempt("rejected", reasons=(f"its data: {e}",)))
            self.say(
                f"follow: {chunk.name}: skipped, nothing trained ({e}); the next chunk is "
                "taken. To train it after a fix, put it back under a new name"
            )
            shutil.rmtree(step.attempt_dir, ignore_errors=True)
            return None
        except Exception as e:
            self.registry.record(step.attempt("failed", reasons=(f"{type(e).__name__}: {e}",)))
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                raise CheckpointError(
                    f"a disk filled up while training {chunk.name} ({e.strerror or e}): "
                    f"nothing of it was published, {step.kept}; free space where the run "
                    f"writes ({self.run_dir}, table.tiers.store_dir) and start the follower "
                    "again: it trains this chunk"
                ) from e
            raise

    def _publish(self, step: _Step, cand: Candidate) -> Version:
        days, current = step.days, step.current
        handle = self.cluster.handle
        version, removed = publish_candidate(
            self.registry,
            cand,
            step.attempt("published", reasons=("trained on its chunk",), **_both(cand)),
            Disks(handle.client if handle is not None else None, self.config.source),
            self.config.retrain.keep_versions,
            self.status.trained,
            parent=step.base,
            train_days=days,
            trained_through=max([*days, current.trained_through if current else ""]),
            eval_day="",
            chunk=step.chunk.name,
            files=step.chunk.files,
            landed=step.landed,
        )
        # The version holds a copy of the candidate's checkpoint (its config and metrics in
        # its manifest, its scores in the registry), its rows are in the stores: a folder a
        # chunk would otherwise grow the disk by, for as long as the follower runs.
        shutil.rmtree(step.attempt_dir, ignore_errors=True)
        self.status.newest_landed = max(self.status.newest_landed, step.landed)
        self.status.published = version.name
        n = len(step.chunk.files)
        self.say(
            f"follow: published {version.name}, trained on {step.chunk.name} ({n} "
            f"file{'s' * (n != 1)}, landed {time.time() - step.landed:.1f} s ago). "
            f"{_scores(cand.baseline, cand.metrics)}.{removed}"
        )
        return version


def _both(cand: Candidate) -> dict[str, Any]:
    return {"metrics": cand.metrics, "baseline": cand.baseline}


def _scores(before: dict[str, float], after: dict[str, float]) -> str:
    def fmt(m: dict[str, float]) -> str:
        return ", ".join(f"{k} {m[k]:.5f}" for k in ("auc", "logloss") if k in m)

    return f"Progressive (before training): {fmt(before)}; after: {fmt(after)}"


def follow(
    config: RunConfig,
    *,
    say: Callable[[str], None] | None = None,
    echo: Callable[[str], None] | None = None,
    progress: Progress | None = None,
    max_chunks: int | None = None,
    stop: StopRequest | None = None,
) -> Outcome:
    """Train each new complete chunk of the logs into a published version until stopped
    (SIGTERM, Ctrl-C, ``stop``) or, with ``max_chunks``, after that many chunks. ``say``
    takes the follower's own lines (a chunk published or rejected, a listing that failed),
    ``echo`` the training's, as ``daskhps train`` says them."""
    say = say or (lambda message: log.info("%s", message))
    run_dir = Path(config.run.dir)
    refuse_training_run(run_dir, config.source)
    check_env()
    stop = stop or StopRequest()
    status = FollowStatus()
    with RetrainLock(run_dir), stop.installed(), exported(status), KeptCluster() as cluster:
        registry = registry_of(config)
        current = check_current(registry, config)
        status.published = current.name if current else None
        status.newest_landed = current.landed if current else 0.0
        shown = (not config.run.quiet) if progress is None else progress is True
        paths, require_complete = _logs(config, shown)
        if config.retrain.keep_versions is None:
            say(
                "follow: retrain.keep_versions is null: every version stays on disk; set it "
                "to bound the disk a long-running follower uses"
            )
        say(
            f"follow: watching {', '.join(map(storage.shown, paths))} every "
            f"{config.retrain.poll_seconds:g} s (from {status.published or 'scratch'})"
        )
        # Started now, not at the first chunk: the first chunk's freshness does not pay for
        # it, and the dashboard (with this follower's gauges on /metrics) is up while idle.
        handle = cluster.get(lambda: start_cluster(**cluster_args(config)))
        if handle.dashboard_link:
            say(f"follow: dashboard {handle.dashboard_link}")
        follower = _Follower(config, registry, cluster, status, stop, say, echo, progress)
        follower.run(paths, require_complete, max_chunks)
        current = registry.current()
        return Outcome(
            ExitCode.PUBLISHED,
            f"follow: stopped after {status.trained} chunk{'s' * (status.trained != 1)}; "
            f"{current.name if current else 'nothing'} is current",
            current,
        )

"""The checks before a training run writes anything, and what they found.

::

    writable run.dir, stores, copy ─► a finished run? (say so, write nothing)
      ─► data paths ─► memory and disk plan (check_fits) ─► flags, GPU
      ─► run.dir's earlier run, published versions ─► the checkpoint a resume continues from
         (config changes it accepts, epochs, damaged stores, stores of another run)
      ─► logs generated and listed ─► expiry days
    = Start: what to move aside or discard, and the checkpoint to continue from

Every refusal is one line naming the key, path or flag that would fix it, and comes before
any file of the run changes; the checks that need the workers come first on the cluster
(:func:`check_cluster_fits`, the plan's input in :mod:`daskhps.training.loop`), and only then
does :meth:`Start.settle` discard checkpoints and write ``config.yaml``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daskhps._paths import check_writable_dir
from daskhps._text import counted
from daskhps.capacity import check_fits
from daskhps.capacity.fit import check_cluster_fits as fits_cluster
from daskhps.config import RunConfig
from daskhps.data.holdout import read_train_and_holdout
from daskhps.data.readers import ClickLog
from daskhps.data.source import day_of, resolve_files
from daskhps.distributed.cgroups import worker_memory_caps
from daskhps.errors import ConfigError, DataError, ResumeError, RunExistsError
from daskhps.monitor.progress import Progress
from daskhps.runfiles import rundir
from daskhps.runfiles.checkpoint import (
    Checkpoint,
    checkpoints_dir,
    find_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    store_damage,
)
from daskhps.runfiles.replica import Replica
from daskhps.runfiles.writing import remove_checkpoint
from daskhps.training import resume as resuming
from daskhps.training.killpoints import check_env
from daskhps.training.recovery import restore_from_copy

__all__ = ["Start", "check_cluster_fits", "preflight", "refuse_damaged_stores"]

log = logging.getLogger(__name__)


@dataclass
class Start:
    """What the checks before a run found: the earlier run in run.dir, whether it is replaced
    (``--overwrite``), later checkpoints a resume discards, the new run's disk estimate, the
    checkpoint the run continues from, and the logs."""

    earlier: rundir.EarlierRun | None
    need: int | None
    store_bytes: int | None = None  # the stores' part of ``need``, over all workers
    replace: bool = False
    discard: list[str] = field(default_factory=list)
    logs: tuple[ClickLog, ClickLog | None] = None  # type: ignore[assignment]
    ckpt: Checkpoint | None = None  # a resume's checkpoint, or a warm start's
    copy_stores_from: Path | None = None  # another run's folder, whose stores a resume copies
    complete: str | None = None  # a resume of a finished run: the line that says so
    settled: bool = False  # the discards done and config.yaml written

    def settle(self, config: RunConfig, run_dir: Path) -> None:
        """The checks that needed the cluster passed: discard the checkpoints a resume from an
        earlier one replaces, and record the config (once per run, not per restart)."""
        if self.settled:
            return
        for name in self.discard:
            # a warning, quiet or not: it removes a checkpoint the user may look for
            log.warning("discarding checkpoint %s: the run resumes from an earlier one", name)
            remove_checkpoint(checkpoints_dir(run_dir) / name)
        (run_dir / "config.yaml").write_text(config.to_yaml())
        self.settled = True


def preflight(
    config: RunConfig,
    *,
    resume: bool,
    overwrite: bool,
    checkpoint: str | None,
    warm_start: Checkpoint | None,
    replica: Replica | None,
    progress: Progress,
    echo: Callable[[str], None],
) -> Start:
    """Every check that needs no worker, in an order that touches nothing but generated
    logs (see the module docstring); ``replica`` is the run's copy (``RunParts.replica``)."""
    return _Preflight(config, warm_start, replica, progress, echo).run(
        resume, overwrite, checkpoint
    )


class _Preflight:
    def __init__(
        self,
        config: RunConfig,
        warm_start: Checkpoint | None,
        replica: Replica | None,
        progress: Progress,
        echo: Callable[[str], None],
    ) -> None:
        self.config = config
        self.run_dir = Path(config.run.dir)
        self.warm_start = warm_start
        self.progress = progress
        self.echo = echo
        self.replica = replica
        # The embedded cluster's workers share this machine's disk, so the stores are checked
        # here, before any worker starts; a cluster's workers each hold their own stores,
        # which only they can check (daskhps.training.placement, once the cluster is up).
        self.stores_here = config.cluster.local

    def run(self, resume: bool, overwrite: bool, checkpoint: str | None) -> Start:
        cfg = self.config
        # Folders that cannot be written: named now, not as an errno on a worker (and before
        # check_fits, which would find no free space there).
        check_writable_dir(self.run_dir, "the run", "set run.dir to a writable folder")
        if self.stores_here:  # on a cluster's workers, each checks its own disk
            check_writable_dir(
                cfg.table.tiers.store_dir,
                "the table's stores",
                "set table.tiers.store_dir to a writable folder",
            )
        if self.replica is not None:
            self.replica.check_writable(cfg.source)
        if resume and checkpoint is None and self.warm_start is None:
            finished = self._finished()
            if finished is not None:
                return finished
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
        rundir.refuse_published(self.run_dir, store_dir if self.stores_here else None, cfg.source)
        earlier = rundir.find_earlier_run(self.run_dir, store_dir)
        start = Start(earlier=earlier, need=sizing.disk.total, store_bytes=sizing.disk.stores)
        if resume:
            self._resume(start, checkpoint, overwrite)
        else:
            self._new(start, overwrite)
        if cfg.data.generate is not None:
            cfg.data.generate.ensure(progress=self.progress is True)  # a bar, or nothing
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

    def _finished(self) -> Start | None:
        """A resume of a run whose latest checkpoint ends its schedule: said before sizing or
        starting anything. A config it refuses and damaged stores are still refused (they
        need fixing either way); a store lost with its disk comes back from the copy, as a
        resume would restore it."""
        done = latest_checkpoint(self.run_dir)
        line = None if done is None else resuming.complete_line(done, self.config, self.run_dir)
        if done is None or line is None:
            return None
        resuming.check_resume(done, self.config)
        self._check_stores(done)
        return Start(earlier=None, need=None, ckpt=done, complete=line)

    def _resume(self, start: Start, checkpoint: str | None, overwrite: bool) -> None:
        start.ckpt = ckpt = self._resume_point(checkpoint)
        later = [c for c in list_checkpoints(self.run_dir) if c.passes_done > ckpt.passes_done]
        start.copy_stores_from = self._stores_owner(ckpt)
        start.discard = [c.name for c in later]
        if start.discard and not overwrite:
            raise RunExistsError(
                f"{self.config.source}: resuming from {ckpt.name} rewrites the later "
                f"checkpoints of {self.run_dir} ({', '.join(start.discard)}); add --overwrite "
                "to discard them, or resume from the latest (leave out --checkpoint)"
            )

    def _new(self, start: Start, overwrite: bool) -> None:
        start.ckpt = self.warm_start
        if self.warm_start is not None and self.stores_here:
            refuse_damaged_stores(self.warm_start)
        if start.earlier is not None and not overwrite:
            raise RunExistsError(
                f"{self.config.source}: {self.run_dir} already holds a run "
                f"({start.earlier.describe()}); pass --resume to continue it, or --overwrite "
                "to start over (the earlier run is deleted once the new run's first "
                "checkpoint is complete), or set run.dir to a new folder"
            )
        start.replace = start.earlier is not None

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
        self._check_stores(ckpt)
        accepted = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())
        self.echo(
            f"resuming from {ckpt.path} ({counted(ckpt.passes_done, 'pass', 'passes')} done)"
            + (f"; changed: {accepted}" if accepted else "")
        )
        return ckpt

    def _check_stores(self, ckpt: Checkpoint) -> None:
        """Stores on this machine's disk: missing or damaged ones restored from the copy,
        then refused if still damaged (a cluster's workers do both on their own disks)."""
        if self.stores_here:
            restore_from_copy(ckpt, self.replica)
            refuse_damaged_stores(ckpt)

    def _stores_owner(self, ckpt: Checkpoint) -> Path | None:
        """A resume never writes the stores of another run: stores outside this run's folder
        that the run in another folder trains in (this one a copy of it) are copied into the
        config's ``table.tiers.store_dir`` first (that run's folder is returned), or refused
        when that is the same folder."""
        owner = resuming.stores_owner(ckpt, self.run_dir)
        if owner is None:
            return None
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
        return owner

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
        if self.config.cluster.lacks_cuda():
            raise ConfigError(
                f"{self.config.source}: cluster.gpu: true, but this machine has no CUDA GPU (or "
                "no dask_cuda); set cluster.gpu: auto (a GPU where there is one) or false"
            )


def refuse_damaged_stores(ckpt: Checkpoint) -> None:
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


def check_cluster_fits(config: RunConfig, client: Any, workers: int, resume: bool) -> None:
    """Refuse, in one line, a run that cannot fit the memory of the workers behind
    ``cluster.address`` (the embedded cluster's was sized by the preflight): each worker's
    Dask limit, or its memory cgroup's where that is lower (said, with the lever)."""
    limits = [cap.limit for cap in worker_memory_caps(client).values()]
    fits_cluster(
        config, workers=workers, memory_limit=min(limits, default=0) or None, resume=resume
    )

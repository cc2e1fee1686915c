"""The trainer's side of checkpoints: take one of a live run, keep the newest few.

One checkpoint, in the order that makes a crash at any moment harmless::

    dense state of the replicas ──► dense.pt, state.json         (folder still invisible)
    [base: compact every shard store]
    commit every shard store as <name> (flushes dirty rows: a delta's rows are those written
                                        since the previous commit)
    MANIFEST.json, written last by atomic rename ──► visible
    drop checkpoints beyond ``keep``: their folders, then the store commits only they used
    [checkpoint.replicate_to: every rank's new store files, then the checkpoint's files, its
     manifest last ──► the copy is visible; then what the local side dropped, dropped there]

A crash before the manifest leaves the previous checkpoint as the latest; the store commit of
the torn one is replaced when the resumed run commits that name again.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daskhps import storage
from daskhps.config import RunConfig
from daskhps.distributed import RunGroup, WorkerShards
from daskhps.distributed.disks import remove_folder
from daskhps.errors import CheckpointError, first_line
from daskhps.runfiles.checkpoint import Checkpoint, checkpoint_name, commit_record, list_checkpoints
from daskhps.runfiles.locations import recorded_stores_dir
from daskhps.runfiles.replica import Copied, Replica, mirror_shards
from daskhps.runfiles.writing import (
    finish_checkpoint,
    remove_checkpoint,
    start_checkpoint,
    write_payload,
)
from daskhps.table.stats import day_string
from daskhps.training import worker
from daskhps.training.killpoints import kill_point
from daskhps.training.records import PassRecord
from daskhps.training.recovery import RECOVERABLE
from daskhps.training.watch import Best, Stop

__all__ = ["Checkpointer", "Position"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Position:
    """Where the run stands once a pass is done: ``passes_done`` passes of ``total_passes``
    (the pass just done is pass ``passes_done`` of the run), the last of them pass
    ``pass_index`` of epoch ``epoch`` (both counted from 1), ``step`` optimizer steps taken."""

    passes_done: int
    total_passes: int
    epoch: int
    pass_index: int
    step: int


class Checkpointer:
    """Takes the checkpoints of one run (see the module docstring)."""

    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        group: RunGroup,
        stores_dir: Path,
        days: list[str] | None = None,
        plan: dict[str, Any] | None = None,
        replica: Replica | None = None,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.group = group
        self.stores_dir = stores_dir
        self.days = list(days or [])
        self.plan = plan  # identifies the plan's input; a resume checks it
        self.replica = replica
        self.lifecycle: dict[str, dict[str, int]] = {}  # the trainer's, per log day

    def note_lifecycle(self, rec: PassRecord, day: int | None) -> None:
        """Add a pass's admitted keys (to ``day``, the last log day of its rows) and expired
        rows (to the day that ended) to the run's figures per day (checkpoints and
        ``inspect`` show them)."""
        if rec.admission and day is not None:
            per = self.lifecycle.setdefault(day_string(day) or "", {"admitted": 0, "expired": 0})
            per["admitted"] += int(rec.admission["admitted"])
        if rec.expiry and rec.expiry.get("day"):
            per = self.lifecycle.setdefault(rec.expiry["day"], {"admitted": 0, "expired": 0})
            per["expired"] += int(rec.expiry["expired"])

    def due(self, pos: Position) -> bool:
        return self.config.checkpoint.due(pos.passes_done, pos.passes_done == pos.total_passes)

    def kind(self, passes_done: int) -> str:
        """Every ``full_every``-th checkpoint of the run (the first included) is a base."""
        c = self.config.checkpoint
        ordinal = math.ceil(passes_done / c.every_passes) - 1
        return "base" if ordinal % c.full_every == 0 else "delta"

    def take(
        self,
        pos: Position,
        record: PassRecord,
        model: Best | None = None,
        stopped: Stop | None = None,
    ) -> Checkpoint:
        """Checkpoint the run after ``pos.passes_done`` passes; ``record`` is the last pass's
        metrics line, ``model`` the run's best checkpoint (None: this one, the latest),
        ``stopped`` why the run ends here before its schedule does. Raises
        :class:`CheckpointError`; earlier checkpoints stay intact."""
        t0 = time.perf_counter()
        name = checkpoint_name(pos.passes_done)
        kind = self.kind(pos.passes_done)
        at = pos.passes_done - 1  # schedule position of the pass just done (kill points)
        dense = self.group.run(worker.dense_checkpoint, what="dense state")
        folder = start_checkpoint(self.run_dir, name)
        try:
            files = write_payload(
                folder,
                model=dense[0]["model"],
                optimizer=dense[0]["optimizer"],
                rng=[d["rng"] for d in dense],
                state={
                    "epoch": pos.epoch,
                    "pass": pos.passes_done,  # the pass numbers of metrics.jsonl
                    "pass_in_epoch": pos.pass_index,
                    "passes_done": pos.passes_done,
                    "step": pos.step,
                    "record": record.to_json(),
                },
            )
            kill_point("checkpoint_dense", at)
            try:
                if kind == "base":
                    self.group.on_shards(WorkerShards.compact, what="compact shards")
                commits = self.group.on_shards(
                    WorkerShards.commit, name, {"checkpoint": name}, what="commit shards"
                )
            except RECOVERABLE:
                raise  # a worker lost while committing: the run recovers from the previous one
            except Exception as e:  # a worker's OSError (disk full) arrives with its type
                raise CheckpointError(
                    f"checkpoint {folder}: committing the table shards failed: {e}; the "
                    "previous checkpoint is intact: free disk space, then resume with --resume"
                ) from e
            kill_point("checkpoint_commit", at)
            stats = self.group.on_shards(WorkerShards.stats, what="shard stats")
            fields = self._fields(pos, kind, record, stats, commits)
            fields["model"] = model.to_json() if model is not None else None
            fields["stopped"] = stopped.to_json() if stopped is not None else None
            fields["seconds"] = time.perf_counter() - t0  # to write it, all but the manifest
            ckpt = finish_checkpoint(folder, files, fields)
        except BaseException:
            remove_checkpoint(folder)  # never half of one on disk (it would not load anyway)
            raise
        kill_point("after_checkpoint", at)
        self.prune(model.checkpoint if model is not None else None)
        self.replicate(ckpt)
        return ckpt

    def _own_stores(self, stores: Path) -> bool:
        """Stores this run made: inside its folder, or the config's (and the re-sharded ones
        beside them)."""
        s = stores.resolve()
        mine = Path(self.config.table.tiers.store_dir).resolve()
        return (
            s.is_relative_to(self.run_dir.resolve())
            or s == mine
            or (s.parent == mine.parent and s.name.startswith(f"{mine.name}-resharded-"))
        )

    def replicate(self, ckpt: Checkpoint) -> Copied | None:
        """Copy ``ckpt`` (complete, and the newest) and its stores to ``checkpoint.replicate_to``
        (see :mod:`daskhps.runfiles.replica`); what moved, None without a copy. Raises
        :class:`CheckpointError` (a lost worker as itself); the local checkpoint stays whole."""
        r = self.replica
        if r is None:
            return None
        t0 = time.perf_counter()
        try:
            out = Copied()
            for moved in self.group.on_shards(mirror_shards, r.url, False, what="copy stores"):
                out.add(moved)
            out.add(r.put_checkpoint(ckpt))
            kill_point("after_replica", ckpt.passes_done - 1)
            out.removed += r.prune_checkpoints({c.name for c in list_checkpoints(self.run_dir)})
            for gone in self.group.on_shards(mirror_shards, r.url, True, what="prune the copy"):
                out.add(gone)
        except RECOVERABLE:
            raise
        except Exception as e:
            why = storage.failure(r.url, e, "write") if storage.is_url(r.url) else first_line(e)
            raise CheckpointError(
                f"copying checkpoint {ckpt.name} to checkpoint.replicate_to "
                f"{storage.shown(r.url)} failed: {why}; the local "
                "checkpoint is complete: make the location writable, then resume with --resume "
                "(the copy catches up)"
            ) from e
        log.info(
            "copied %s to %s: %d files, %.1f MiB in %.2f s (%d removed)",
            *(ckpt.name, r.url, out.files, out.bytes / 2**20, time.perf_counter() - t0),
            out.removed,
        )
        return out

    def _fields(
        self,
        pos: Position,
        kind: str,
        record: PassRecord,
        stats: list[dict[str, Any]],
        commits: list[dict[str, dict[str, Any]]],
    ) -> dict[str, Any]:
        cfg = self.config
        specs = cfg.table_specs()
        first = specs[0].name
        shards = []
        for s, c in zip(stats, commits, strict=True):
            ts = [s["tables"][spec.name] for spec in specs]
            shard = {
                "rank": s["rank"],
                "device_rows": sum(int(t["device"].get("rows", 0)) for t in ts),
                "host_rows": sum(int(t.get("host", {}).get("rows", 0)) for t in ts),
                "store_bytes": sum(int(t["store"].get("bytes_on_disk", 0)) for t in ts),
                # which commit of that name: a later one (another run) is damage
                **commit_record(c[first]),
            }
            if len(specs) > 1:  # each table's bytes too: inspect's table lines add up
                shard["tables"] = {
                    spec.name: {
                        **commit_record(c[spec.name]),
                        "store_bytes": int(t["store"].get("bytes_on_disk", 0)),
                    }
                    for spec, t in zip(specs, ts, strict=True)
                }
            shards.append(shard)
        return {
            "kind": kind,
            "passes_done": pos.passes_done,
            "epoch": pos.epoch,
            "pass": pos.passes_done,
            "pass_in_epoch": pos.pass_index,
            "step": pos.step,
            "commit": checkpoint_name(pos.passes_done),
            "stores_dir": recorded_stores_dir(self.stores_dir, self.run_dir),
            "num_workers": self.group.world_size,
            "num_shards": cfg.passes.plan.num_shards,
            "table": specs[0].layout(),
            "tables": [spec.layout() for spec in specs] if len(specs) > 1 else [],
            "config": cfg.to_dict(),
            "metrics": record.eval or {},
            "train_loss": record.train_loss,
            "days": self.days,
            "plan": self.plan,
            "shards": shards,
            "lifecycle": self.lifecycle,
        }

    def prune(self, model: str | None = None) -> list[str]:
        """Delete checkpoints beyond ``checkpoint.keep`` (oldest first) but the run's model
        ``model``, the store commits only they used, and stores no kept checkpoint uses;
        returns the removed names."""
        found = list_checkpoints(self.run_dir)
        newest = {c.name for c in found[max(0, len(found) - self.config.checkpoint.keep) :]}
        extra = [c for c in found if c.name not in newest and c.name != model]
        for c in extra:
            remove_checkpoint(c.path)
        kept = [c for c in found if c not in extra]
        live = self.stores_dir.resolve()
        ours = [c for c in kept if c.stores_dir.resolve() == live]
        if extra and ours:
            # only this run's own checkpoint commits: others (published versions) may share
            # the stores
            self.group.on_shards(
                WorkerShards.drop_commits_before, ours[0].commit, "pass-", what="drop old commits"
            )
        used = {c.stores_dir.resolve() for c in kept} | {live}
        for c in extra:
            if not self._own_stores(c.stores_dir):
                continue  # another run's (a resume copied its rows): never this run's to remove
            if c.stores_dir.resolve() not in used:
                log.info("removing stores %s: no kept checkpoint uses them", c.stores_dir)
                # on every worker: each removes what its own disk holds of them
                self.group.client.run(remove_folder, str(c.stores_dir))
                used.add(c.stores_dir.resolve())
        return [c.name for c in extra]

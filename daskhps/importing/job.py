"""``daskhps import``: existing embeddings become the starting state of a run.

What it leaves is exactly what a run's first checkpoint would be, taken before any training::

    <table.tiers.store_dir>/<table>/rank-<r>     one store per worker (cluster.n_workers) and
                                                 table, each key in its owner's (ShardMap, as
                                                 in training), committed as pass-000000; a
                                                 table given no rows is an empty store
    <run.dir>/checkpoints/pass-000000/           a checkpoint after 0 passes: the dense model a
                                                 new run starts with, step 0, no plan yet
    <run.dir>/config.yaml

so ``daskhps train CONFIG --resume`` continues from it like from any checkpoint: the stores
are reopened at that commit (re-sharded if the cluster has another worker count), the dense
model is the one a fresh run would build (same seed), and the first pass stages the imported
rows from the stores instead of initialising them. No new way for a run to start was needed.

Order of work, so that a failure at any point leaves nothing behind::

    check the inputs' metadata, the folders, the earlier run (refused without --overwrite)
    write the stores and the checkpoint in staging folders beside their final places,
        checking each chunk's values and keys on the way (table by table)
    move them into place (renames; with --overwrite, the earlier run is moved aside first
        and deleted only once everything is in place, put back otherwise)

A failure before the renames removes the staging folders; the run directory and the store
folder are as they were.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from daskhps._paths import check_writable_dir, free_bytes, tree_bytes
from daskhps.capacity.disk import SNAPSHOT_BYTES_PER_KEY, row_disk_bytes
from daskhps.config import RunConfig
from daskhps.errors import (
    CapacityError,
    DataError,
    RunExistsError,
    StoreLockedError,
)
from daskhps.importing.checks import check_chunk, check_table_keys, duplicate_error
from daskhps.importing.source import Source
from daskhps.importing.staged import RepeatedKey, StagedStores
from daskhps.runfiles import rundir
from daskhps.runfiles.checkpoint import checkpoint_name, checkpoints_dir
from daskhps.runfiles.locations import recorded_stores_dir
from daskhps.runfiles.writing import finish_checkpoint, remove_checkpoint, write_payload
from daskhps.sharding import ShardMap
from daskhps.table.spec import TableSpec
from daskhps.tiers.lock import WriterLock
from daskhps.tiers.store.check import CommitId
from daskhps.tiers.store.durable import fsync_dir

__all__ = ["CHUNK_ROWS", "COMMIT", "ImportResult", "import_table", "import_tables"]

log = logging.getLogger(__name__)

COMMIT = checkpoint_name(0)  # the checkpoint (and store commit) of a run 0 passes in
CHUNK_ROWS = 1 << 18  # rows read, checked and routed at a time: bounds memory
_STAGING = ".import"


@dataclass(frozen=True)
class ImportResult:
    run_dir: Path
    stores_dir: Path
    checkpoint: Path
    rows: int
    workers: int
    state: str  # "given" or "initial" (several tables: "mixed" when some tables were given it)
    seconds: float
    bytes: int
    shards: list[dict[str, Any]] = field(default_factory=list)
    # several tables: per table (in order), its rows, files and optimizer state; empty with one
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "stores_dir": str(self.stores_dir),
            "checkpoint": str(self.checkpoint),
            "rows": self.rows,
            "workers": self.workers,
            "optimizer_state": self.state,
            "seconds": round(self.seconds, 3),
            "rows_per_second": round(self.rows_per_second, 1),
            "bytes": self.bytes,
            "shards": self.shards,
            **({"tables": self.tables} if self.tables else {}),
        }


@dataclass(frozen=True)
class _Staging:
    """Where an import writes before anything is in place: beside the stores (a rename
    must stay on their file system) and inside run.dir."""

    stores: Path
    checkpoints: Path
    created: tuple[Path, ...]  # folders above them that did not exist: removed with them

    @classmethod
    def of(cls, run_dir: Path, store_dir: Path) -> _Staging:
        stores = store_dir.parent / f".{store_dir.name}{_STAGING}"
        checkpoints = run_dir / _STAGING
        created: set[Path] = set()
        for p in (stores.parent, checkpoints.parent):
            while not p.exists() and p != p.parent:
                created.add(p)
                p = p.parent
        return cls(stores, checkpoints, tuple(sorted(created, key=lambda p: -len(p.parts))))

    def clear_stale(self) -> None:
        """Remove what a killed import left; refuse while another import is writing."""
        for store in sorted(self.stores.glob("*/rank-*")):
            try:
                WriterLock(store, "staged store").acquire().release()
            except StoreLockedError as e:
                raise RunExistsError(
                    f"another daskhps import is writing {self.stores} ({e}); wait for it to "
                    "finish, or give this one other folders (run.dir, table.tiers.store_dir)"
                ) from None
        self.remove()

    def remove(self) -> None:
        for p in (self.stores, self.checkpoints):
            shutil.rmtree(p, ignore_errors=True)
        for p in self.created:  # deepest first; a folder the import filled stays
            with contextlib.suppress(OSError):
                p.rmdir()


def _preflight(
    config: RunConfig, sources: Mapping[str, Source], overwrite: bool
) -> rundir.EarlierRun | None:
    """Every check that reads no row: the inputs' metadata, the folders, the earlier run, the
    disk. Returns the earlier run ``--overwrite`` replaces."""
    for source in sources.values():
        source.check()
    if sum(s.rows for s in sources.values()) == 0:
        files = [f for s in sources.values() for f in s.files()]
        raise DataError(f"{', '.join(files)}: no rows; nothing to import")
    run_dir, store_dir = Path(config.run.dir), Path(config.table.tiers.store_dir)
    check_writable_dir(run_dir, "the run", "set run.dir to a writable folder")
    check_writable_dir(
        store_dir, "the table's stores", "set table.tiers.store_dir to a writable folder"
    )
    rundir.ensure_no_run_dir_clash(run_dir, store_dir)
    rundir.settle_interrupted(run_dir)  # a killed `train --overwrite`, put right first
    rundir.refuse_published(run_dir, store_dir, config.source)
    earlier = rundir.find_earlier_run(run_dir, store_dir)
    if earlier is not None and not overwrite:
        raise RunExistsError(
            f"{config.source}: {run_dir} already holds a run ({earlier.describe()}); an import "
            "starts a new run: pass --overwrite to replace it (the earlier run is deleted once "
            "the import is complete, and kept if it fails), or set run.dir and "
            "table.tiers.store_dir to new folders"
        )
    rows = sum(s.rows for s in sources.values())
    need = sum(
        s.rows * (row_disk_bytes(s.spec.width) + SNAPSHOT_BYTES_PER_KEY) for s in sources.values()
    )
    where, free = free_bytes(store_dir)
    if need > free:
        raise CapacityError(
            f"{config.source}: importing {rows:,} rows needs about {need >> 20} MiB in "
            f"table.tiers.store_dir ({store_dir}), and {where} has {free >> 20} MiB free; free "
            "disk space or set table.tiers.store_dir to a larger disk"
        )
    return earlier


def _earlier_row(source: Source, key: int, chunk_rows: int) -> str:
    """Where ``key`` first appears in the input (the keys are read again: an error path)."""
    for file, start, keys in source.key_chunks(chunk_rows):
        hit = np.flatnonzero(keys == key)
        if hit.size:
            return f"{file} row {start + int(hit[0])}"
    return "an earlier row"  # not reached: the store holds it, so a chunk had it


def _dense_start(config: RunConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """The dense model and optimizer state a new run of ``config`` starts from: each rank
    builds them from :meth:`TrainSetup.from_config`, as the trainer does."""
    from daskhps.training import worker

    setup = worker.TrainSetup.from_config(config, "import")
    model, optimizer = worker.build_dense(setup)
    return model.state_dict(), optimizer.state_dict()


def _write_checkpoint(
    folder: Path,
    config: RunConfig,
    stores_dir: Path,
    workers: int,
    shards: list[dict[str, Any]],
    imported: dict[str, Any],
    seconds: float,
) -> None:
    model, optimizer = _dense_start(config)
    folder.mkdir(parents=True)
    state = {"epoch": 0, "pass": 0, "pass_in_epoch": 0, "passes_done": 0, "step": 0}
    files = write_payload(
        folder, model=model, optimizer=optimizer, rng=[], state={**state, "record": {}}
    )
    specs = config.table_specs()
    finish_checkpoint(
        folder,
        files,
        {
            "kind": "base",
            **state,
            "commit": COMMIT,
            "stores_dir": recorded_stores_dir(stores_dir, Path(config.run.dir)),
            "num_workers": workers,
            "num_shards": config.passes.plan.num_shards,
            "table": specs[0].layout(),
            # several tables: every table's layout, as training's checkpoints (format 2)
            **({"tables": [s.layout() for s in specs]} if len(specs) > 1 else {}),
            "config": config.to_dict(),
            "metrics": {},
            "train_loss": None,
            "days": [],
            "plan": None,  # no plan yet: the run that resumes from here makes its own
            "shards": [_shard_record(s) for s in shards],
            "imported": imported,
            "seconds": seconds,
        },
    )


def _commit_of(staged: dict[str, Any]) -> dict[str, Any]:
    commit = CommitId.from_json(staged)
    assert commit is not None  # finish records it
    return commit.to_json()


def _shard_record(staged: dict[str, Any]) -> dict[str, Any]:
    """A rank's record in the checkpoint, from what :meth:`StagedStores.finish` says of it
    (several tables: :func:`_rank_records`): its stores' bytes and its commit's identity
    (the first table's; with several, every table's commit and bytes in ``tables``), nothing
    in the device or host tier."""
    record = {"rank": staged["rank"], "device_rows": 0, "host_rows": 0}
    out = {**record, "store_bytes": staged["store_bytes"], **_commit_of(staged)}
    if "tables" in staged:
        out["tables"] = {  # each table's bytes too: inspect's table lines add up
            name: {**_commit_of(t), "store_bytes": t["store_bytes"]}
            for name, t in staged["tables"].items()
        }
    return out


def _rank_records(finished: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per rank, what :meth:`StagedStores.finish` said of each table's store (``finished``:
    per table, in table order): the first table's commit, every table's rows and bytes
    summed, and with several tables each table's record in ``tables``."""
    per_table = list(finished.values())
    if len(per_table) == 1:
        return per_table[0]
    out = []
    for ranks in zip(*per_table, strict=True):
        out.append(
            {
                **ranks[0],
                "rows": sum(int(r["rows"]) for r in ranks),
                "store_bytes": sum(int(r["store_bytes"]) for r in ranks),
                "tables": dict(zip(finished, ranks, strict=True)),
            }
        )
    return out


def _place(staging: _Staging, config: RunConfig, earlier: rundir.EarlierRun | None) -> Path:
    """Move the staged stores and checkpoint into place; returns the checkpoint's folder."""
    run_dir, store_dir = Path(config.run.dir), Path(config.table.tiers.store_dir)
    aside = rundir.move_aside(earlier, 0, config.source) if earlier is not None else None
    target = checkpoints_dir(run_dir) / COMMIT
    empty_store_dir = store_dir.is_dir()  # an empty folder: no run (find_earlier_run)
    placed_stores = placed_checkpoint = False
    try:
        store_dir.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging.stores, store_dir)  # onto a missing or empty folder
        placed_stores = True
        fsync_dir(store_dir.parent)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging.checkpoints / COMMIT, target)  # visible last: the run exists
        placed_checkpoint = True
        fsync_dir(target.parent)
        (run_dir / "config.yaml").write_text(config.to_yaml())
    except BaseException:
        if placed_checkpoint:
            remove_checkpoint(target)
        if placed_stores:
            shutil.rmtree(store_dir, ignore_errors=True)
            if empty_store_dir:
                store_dir.mkdir(exist_ok=True)
        if aside is not None:
            aside.restore()
        raise
    if aside is not None:
        aside.discard()
    return target


def _imported(sources: Mapping[str, Source], specs: tuple[TableSpec, ...]) -> dict[str, Any]:
    """The checkpoint's note of what was imported: rows, files, whether the optimizer state
    was given; with several tables, also each table's (one given no rows: 0 rows)."""
    listed = list(sources.values())
    given = {s.has_state for s in listed if s.rows}  # of the tables that get rows
    state = "mixed" if len(given) > 1 else "given" if True in given else "initial"
    out: dict[str, Any] = {
        "rows": sum(s.rows for s in listed),
        "files": [f for s in listed for f in s.files()],
        "optimizer_state": state,
    }
    if len(specs) > 1:
        out["tables"] = {}
        for spec in specs:
            s = sources.get(spec.name)
            out["tables"][spec.name] = {
                "rows": 0 if s is None else s.rows,
                "files": [] if s is None else s.files(),
                "optimizer_state": "given" if s is not None and s.has_state else "initial",
            }
    return out


def _write_rows(
    stores: StagedStores,
    source: Source,
    spec: TableSpec,
    tagged: tuple[int, list[str]] | None,
    chunk_rows: int,
    bar: tqdm[Any],
) -> None:
    """Check and write every chunk of ``source`` into ``stores`` (one table's); ``tagged``:
    the table's index and every table's name, when keys must carry their table."""
    try:
        for chunk in source.chunks(chunk_rows):
            if tagged is not None:
                check_table_keys(chunk, *tagged)
            check_chunk(chunk, spec)
            stores.write(chunk)
            bar.update(len(chunk))
    except RepeatedKey as e:
        first = _earlier_row(source, e.key, chunk_rows)
        raise duplicate_error(e.key, first, e.row) from None


def _stage(
    staging: _Staging,
    specs: tuple[TableSpec, ...],
    sources: Mapping[str, Source],
    shard_map: ShardMap,
    chunk_rows: int,
    rows: int,
    progress: bool,
) -> list[dict[str, Any]]:
    """Write every table's rows (``rows`` in all) into its staged rank stores, an empty one
    where ``sources`` gives none, and commit them; per rank, its record in the checkpoint."""
    names = [s.name for s in specs]
    staged: dict[str, StagedStores] = {}
    try:
        for spec in specs:
            staged[spec.name] = StagedStores(spec, shard_map, staging.stores, chunk_rows)
        # disable=None: a bar on a terminal only, never in a log file (one endless line)
        off = None if progress else True
        with tqdm(total=rows, unit="row", unit_scale=True, desc="importing", disable=off) as bar:
            for index, spec in enumerate(specs):
                source = sources.get(spec.name)
                if source is not None:
                    tagged = (index, names) if len(specs) > 1 else None
                    _write_rows(staged[spec.name], source, spec, tagged, chunk_rows, bar)
        finished = {
            name: stores.finish(
                COMMIT,
                {"checkpoint": COMMIT, "imported": sources[name].rows if name in sources else 0},
            )
            for name, stores in staged.items()
        }
    finally:
        for stores in staged.values():
            stores.close()
    return _rank_records(finished)


def import_table(
    config: RunConfig,
    source: Source,
    *,
    workers: int | None = None,
    overwrite: bool = False,
    chunk_rows: int = CHUNK_ROWS,
    progress: bool = True,
) -> ImportResult:
    """:func:`import_tables` of the one table of ``config`` (:class:`ConfigError` when it has
    several)."""
    return import_tables(
        config,
        {config.table_spec().name: source},
        workers=workers,
        overwrite=overwrite,
        chunk_rows=chunk_rows,
        progress=progress,
    )


def import_tables(
    config: RunConfig,
    sources: Mapping[str, Source],
    *,
    workers: int | None = None,
    overwrite: bool = False,
    chunk_rows: int = CHUNK_ROWS,
    progress: bool = True,
) -> ImportResult:
    """Write ``sources``' rows (per table name; :func:`~daskhps.importing.tables.open_sources`)
    as the starting state of ``config``'s run (module docstring), in ``workers`` rank stores
    per table (default ``cluster.n_workers``). A table ``sources`` lacks starts empty.
    ``progress``: a bar of the rows written, when stderr is a terminal.

    Raises
    ------
    DataError
        A bad input: a missing file, a wrong width, a NaN or infinity, a negative
        accumulator, a key given twice, a key of another table; one line naming the file and
        the row.
    RunExistsError
        run.dir or the stores hold a run and ``overwrite`` is false, or they hold published
        versions (always refused).
    CapacityError
        The disk of the stores cannot hold the rows.
    """
    t0 = time.perf_counter()
    specs = config.table_specs()
    names = [s.name for s in specs]
    unknown = sorted(set(sources) - set(names))
    if unknown:
        raise DataError(
            f"{config.source} has no table {unknown[0]!r} (its tables: {', '.join(names)})"
        )
    run_dir, store_dir = Path(config.run.dir), Path(config.table.tiers.store_dir)
    workers = workers or config.cluster.n_workers
    shard_map = ShardMap(config.passes.plan.num_shards, workers)
    earlier = _preflight(config, sources, overwrite)
    staging = _Staging.of(run_dir, store_dir)
    staging.clear_stale()
    imported = _imported(sources, specs)
    rows = int(imported["rows"])
    try:
        shards = _stage(staging, specs, sources, shard_map, chunk_rows, rows, progress)
        _write_checkpoint(
            staging.checkpoints / COMMIT,
            config,
            store_dir,
            workers,
            shards,
            imported,
            time.perf_counter() - t0,
        )
        checkpoint = _place(staging, config, earlier)
    finally:
        staging.remove()
    log.info("imported %d rows into %s: %s", rows, store_dir, json.dumps(shards))
    return ImportResult(
        run_dir=run_dir,
        stores_dir=store_dir,
        checkpoint=checkpoint,
        rows=rows,
        workers=workers,
        state=str(imported["optimizer_state"]),
        seconds=time.perf_counter() - t0,
        bytes=sum(tree_bytes(store_dir / s.name) for s in specs),
        shards=shards,
        tables=dict(imported.get("tables", {})),
    )

"""``predict``: score click logs on a Dask cluster and write parquet, one part per input file.

::

    <out>/
      part-00000.parquet     file (string) | row (int64) | probability (float32)
      part-00001.parquet     ... one per input file, in sorted path order
      _predict.json          model, commit, files, rows, skipped rows by reason, files read
                             without a label column, seconds
      _SUCCESS               written last: the output is complete

A part is written as a hidden ``.part-*.tmp`` file and renamed (``pd.read_parquet(out)`` reads
the folder as one dataset); a failed job removes its parts and leaves no ``_SUCCESS``. See
:mod:`daskhps.serve.score` for how a file is scored and what a row id is. Files with or
without the label column are scored alike (``labels``, decided per file by default); the label
is never used.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from daskhps._paths import check_writable_dir
from daskhps._text import counted
from daskhps.config import RunConfig
from daskhps.data.badrows import BadRowPolicy, BadRowReport, Reason
from daskhps.data.labels import check_label_mode
from daskhps.data.parse import read_shard
from daskhps.data.schema import LABEL
from daskhps.data.source import resolve_files
from daskhps.distributed import start_cluster
from daskhps.distributed.configured import cluster_args
from daskhps.errors import DaskHPSError, DataError, StoreExistsError
from daskhps.serve.score import CacheSizes, Scorer
from daskhps.serve.stores import check_stores
from daskhps.serve.version import Servable

__all__ = ["PredictResult", "predict"]

log = logging.getLogger(__name__)

SUCCESS = "_SUCCESS"
SUMMARY = "_predict.json"  # "_": parquet readers of the folder skip it
# A file the model's schema cannot read at all is an error, not a skipped shard: scoring it
# would silently leave its rows out.
_FATAL = (Reason.SCHEMA_MISMATCH, Reason.UNREADABLE_SHARD)
# A file may have no row to score without any row failing to parse.
_NO_ROWS = (Reason.EMPTY_SHARD, Reason.TRUNCATED_FILE)


@dataclass(frozen=True)
class _Job:
    """What every scoring task needs; scattered to the workers once."""

    token: str
    servable: Servable
    sizes: CacheSizes
    batch_size: int
    out: str
    policy: BadRowPolicy
    labels: str  # "auto", "present" or "absent": see daskhps.data.labels


@dataclass
class PredictResult:
    """What :func:`predict` wrote (also in ``_predict.json``)."""

    out: Path
    model: str
    commit: str
    files: list[str]
    rows: int
    skipped: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    lookup: dict[str, int] = field(default_factory=dict)
    unlabelled: list[str] = field(default_factory=list)  # files read without a label column
    chosen: str = ""  # why the run gave this checkpoint, when not its latest (Servable.chosen)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "chosen": self.chosen,
            "commit": self.commit,
            "files": self.files,
            "rows": self.rows,
            "skipped_rows": self.skipped,
            "files_without_labels": self.unlabelled,
            "seconds": self.seconds,
            "rows_per_s": self.rows / self.seconds if self.seconds else None,
            "lookup_rows_from": self.lookup,
            "columns": {"file": "input path", "row": "0-based parsed row of the file"},
        }


_SCORERS: dict[str, Scorer] = {}
_LOCK = threading.Lock()


def _scorer(job: _Job) -> Scorer:
    """This process's scorer of ``job`` (built by the first task that needs it)."""
    with _LOCK:
        s = _SCORERS.get(job.token)
        if s is None:
            s = _SCORERS[job.token] = Scorer(job.servable, job.sizes, job.batch_size)
        return s


def _drop(token: str) -> dict[str, int]:
    """Close this process's scorer of a finished job; returns where its rows came from."""
    with _LOCK:
        s = _SCORERS.pop(token, None)
    if s is None:
        return {}
    stats = dict(s.lookup.stats()["rows_from"])
    s.close()
    return stats


def _part_path(out: str | Path, index: int) -> Path:
    return Path(out) / f"part-{index:05d}.parquet"


def _score_file(index: int, path: str, job: _Job) -> dict[str, Any]:
    """Read, score and write one input file; returns its bad-row report and row count, or
    ``{"error": exception}`` for a daskhps error (bad input, a missing commit): the client
    raises it, whereas a task that raised would also be logged, as several lines, by its
    worker."""
    try:
        return _score_and_write(index, path, job)
    except DaskHPSError as e:
        return {"error": e}


def _score_and_write(index: int, path: str, job: _Job) -> dict[str, Any]:
    schema = job.servable.config.data.schema
    frame, report = read_shard(path, schema, job.policy, job.labels)
    if any(reason in _FATAL for _, reason in report.counts):
        try:  # the parser's own message names the file and the columns
            read_shard(path, schema, BadRowPolicy(action="fail"), job.labels)
        except DataError as e:
            raise DataError(
                f"cannot score {path} with model {job.servable.name!r}: {e}; score logs of "
                f"the schema the model was trained on ({schema.name})"
            ) from None
    if len(frame) == 0 and any(r not in _NO_ROWS for _, r in report.counts):
        hint = (
            ""
            if job.labels == "auto"
            else f" and labels={job.labels!r} (--labels auto decides per file)"
        )
        raise DataError(
            f"cannot score {path} with model {job.servable.name!r}: none of its rows parses "
            f"with the model's schema {schema.name}{hint} ({report.by_reason()}); score logs "
            "of the schema the model was trained on"
        )
    prob = _scorer(job).score(frame)
    n = len(prob)
    table = pa.table(
        {
            "file": pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(n, dtype=np.int32)), pa.array([path])
            ),
            "row": pa.array(np.arange(n, dtype=np.int64)),
            "probability": pa.array(prob),
        }
    )
    dest = _part_path(job.out, index)
    tmp = dest.with_name(f".{dest.name}.tmp")  # hidden from readers of the folder
    pq.write_table(table, tmp)
    os.replace(tmp, dest)
    # A file read without its label column gives NaN labels (a labelled row is 0 or 1).
    unlabelled = n > 0 and bool(np.isnan(frame[LABEL].to_numpy()).all())
    return {"rows": n, "report": report, "unlabelled": unlabelled}


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise StoreExistsError(f"predict output {out} is a file; give a folder")
    check_writable_dir(out, "predictions", "choose a writable --out")
    old = sorted(out.glob("part-*.parquet")) + [p for p in (out / SUCCESS,) if p.exists()]
    if old and not overwrite:
        raise StoreExistsError(
            f"predict output {out} already holds predictions ({old[0].name}, ...); choose "
            "another folder or pass overwrite (--overwrite) to replace them"
        )
    for p in [*old, out / SUMMARY, *out.glob(".part-*.tmp")]:  # tmp: of a killed job
        p.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def predict(
    servable: Servable,
    data: str | list[str],
    out: str | os.PathLike[str],
    *,
    client: Any = None,
    address: str | None = None,
    n_workers: int | None = None,
    sizes: CacheSizes | None = None,
    batch_size: int = 4096,
    overwrite: bool = False,
    labels: str = "auto",
    echo: Callable[[str], None] | None = None,
) -> PredictResult:
    """Score every file of ``data`` (paths, folders or globs) with ``servable``.

    Runs on ``client`` if given, else on a cluster from the model's config (a LocalCluster,
    or the scheduler at ``address``). ``sizes`` are each worker's serving caches.
    ``labels``: whether the files hold the label column, ``auto`` (decided per file),
    ``present`` or ``absent`` (see :mod:`daskhps.data.labels`); a label is never used.

    Raises
    ------
    DataError
        ``data`` matches no file, or a file does not match the model's schema.
    StoreExistsError
        ``out`` already holds predictions and ``overwrite`` is false.
    """
    t0 = time.perf_counter()
    check_label_mode(labels)
    files = resolve_files(data)
    outp = Path(out)
    for table in servable.tables:
        check_stores(table, servable.name)
    _prepare_out(outp, overwrite)
    cfg = servable.config
    job = _Job(
        token=uuid.uuid4().hex,
        servable=servable,
        sizes=sizes or CacheSizes(),
        batch_size=batch_size,
        out=str(outp),
        policy=cfg.data.source.bad_rows,
        labels=labels,
    )
    if client is not None:
        results, lookup = _run(client, job, files)
    else:
        with start_cluster(**_cluster_args(cfg, address, n_workers)) as handle:
            if echo is not None:
                workers = counted(len(handle.addresses), "worker")
                echo(f"scoring {counted(len(files), 'file')} on {workers}")
            results, lookup = _run(handle.client, job, files)
    report = BadRowReport.merge(r["report"] for r in results)
    result = PredictResult(
        out=outp,
        model=servable.name,
        chosen=servable.chosen,
        commit=servable.table.commit,
        files=files,
        rows=sum(int(r["rows"]) for r in results),
        skipped=report.by_reason(),
        seconds=time.perf_counter() - t0,
        lookup=lookup,
        unlabelled=[f for f, r in zip(files, results, strict=True) if r["unlabelled"]],
    )
    (outp / SUMMARY).write_text(json.dumps(result.to_dict(), indent=2))
    (outp / SUCCESS).write_text("")
    return result


def _cluster_args(cfg: RunConfig, address: str | None, n_workers: int | None) -> dict[str, Any]:
    """The training run's cluster arguments, on CPU workers without a dashboard, at the
    scheduler ``address`` if given (the config's own is not used), else embedded."""
    local = address is None
    return {
        **cluster_args(cfg),
        "address": address,
        "n_workers": (n_workers or cfg.cluster.n_workers) if local else None,
        "gpus": False,
        "dashboard_address": None,
    }


def _run(client: Any, job: _Job, files: list[str]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One task per file; the workers' scorers are closed whatever happens."""
    shared = client.scatter(job, broadcast=True, hash=False)
    futures = client.map(_score_file, list(range(len(files))), files, job=shared, pure=False)
    lookup: dict[str, int] = {}
    try:
        results = client.gather(futures)
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            raise errors[0]
    except BaseException:
        client.cancel(futures)
        for i in range(len(files)):
            _part_path(job.out, i).unlink(missing_ok=True)
        raise
    finally:
        for stats in client.run(_drop, job.token).values():
            for k, v in stats.items():
                lookup[k] = lookup.get(k, 0) + int(v)
    return results, lookup

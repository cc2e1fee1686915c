"""Read click logs as a Dask dataframe: one partition per input file, in sorted path order.

::

    files (sorted)      part-00000.tsv.gz   part-00001.tsv.gz   ...
                               |                   |
    read_shard (task)    (frame, report)     (frame, report)      one task per file
                               |                   |
    ClickLog.frame       partition 0         partition 1          dd.DataFrame
    ClickLog.report      ---------- BadRowReport.merge ---------> one report

The frame and the report come from the same tasks, so computing or persisting them together
reads each file once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.dataframe as dd
import pandas as pd
from dask.delayed import delayed

from daskhps.data.backend import choose_backend
from daskhps.data.badrows import BadRowPolicy, BadRowReport
from daskhps.data.parse import empty_frame, read_shard
from daskhps.data.schema import Schema, load_schema
from daskhps.data.source import DataSource, resolve_files
from daskhps.monitor import stage_span

__all__ = ["ClickLog", "read_click_log"]

log = logging.getLogger(__name__)


def _to_backend(frame: pd.DataFrame, backend: str) -> Any:
    if backend == "cudf":
        import cudf

        return cudf.DataFrame.from_pandas(frame)
    return frame


def _read(
    path: str, schema: Schema, policy: BadRowPolicy, backend: str
) -> tuple[Any, pd.DataFrame]:
    with stage_span("read"):  # parse and validate too; the hashing inside is "hash"
        frame, report = read_shard(path, schema, policy)
        return _to_backend(frame, backend), report.to_frame()


@dataclass(frozen=True)
class ClickLog:
    """A parsed click log: the frame (one partition per file) and its bad-row report."""

    frame: dd.DataFrame
    report: dd.DataFrame  # BadRowReport.to_frame() rows of every shard
    files: tuple[str, ...]
    schema: Schema
    backend: str

    def persist(self) -> ClickLog:
        """Persist frame and report in one graph (each file is read once)."""
        frame, report = dask.persist(self.frame, self.report)
        return ClickLog(frame, report, self.files, self.schema, self.backend)

    def compute_report(self) -> BadRowReport:
        rep = BadRowReport.from_frame(self.report.compute())
        rep.log_summary(log)
        return rep


def _token(path: str, *args: Any) -> str:
    """Task key of reading one file: its path, size and modification time are part of it, so
    two logs never share a read task (nor does a file rewritten in place with its old one)."""
    try:
        st = os.stat(path)
        stamp: tuple[int, int] = (st.st_size, st.st_mtime_ns)
    except OSError:
        stamp = (-1, -1)  # reading it will report the error
    return dask.base.tokenize(path, stamp, *args)


def read_click_log(
    source: DataSource | str | Sequence[str],
    schema: Schema | str | None = None,
    bad_rows: BadRowPolicy | str | None = None,
    backend: str = "auto",
) -> ClickLog:
    """Lazily read every file of ``source`` into a :class:`ClickLog`.

    ``source`` is a :class:`DataSource`, or paths (files, directories, globs) together with
    ``schema`` (default Criteo) and ``bad_rows`` (default ``skip``). Paths that match nothing
    raise :class:`~daskhps.errors.DataError` right away; bad rows surface when computed.
    """
    if not isinstance(source, DataSource):
        paths = (source,) if isinstance(source, str) else tuple(map(str, source))
        source = DataSource(
            paths=paths,
            schema=load_schema(schema or "criteo"),
            bad_rows=(
                bad_rows
                if isinstance(bad_rows, BadRowPolicy)
                else BadRowPolicy.from_dict(bad_rows)
                if bad_rows is not None
                else BadRowPolicy()
            ),
        )
    files = resolve_files(source.paths, source.days, source.require_complete)
    backend = choose_backend(backend)
    schema_, policy = source.schema, source.bad_rows
    parts = [
        delayed(_read, pure=True, nout=2)(
            f,
            schema_,
            policy,
            backend,
            dask_key_name=f"read-shard-{i}-{_token(f, schema_, policy, backend)}",
        )
        for i, f in enumerate(files)
    ]
    meta = _to_backend(empty_frame(schema_), backend)
    frame = dd.from_delayed([p[0] for p in parts], meta=meta, verify_meta=False)
    report = dd.from_delayed(
        [p[1] for p in parts], meta=BadRowReport().to_frame(), verify_meta=False
    )
    log.info("click log: %d files, schema %s, backend %s", len(files), schema_.name, backend)
    return ClickLog(frame, report, tuple(files), schema_, backend)

"""Read click logs as a Dask dataframe: one partition per input file (or per block of a large
plain-text file), in sorted path order.

::

    files (sorted)      part-00000.tsv.gz   part-00001.tsv (3 blocks)             ...
                               |            |            |            |
    read_shard (task)    (frame, report)  [0, b)       [b, 2b)      [2b, size)   one per part
                               |            |            |            |
    ClickLog.frame       partition 0      partition 1  partition 2  partition 3   dd.DataFrame
    ClickLog.report      ---------------- BadRowReport.merge ------------------> one report

With ``block_size``, a plain-text file larger than it is read in byte ranges of that size; a
range holds the lines that *start* in it, so the ranges of a file hold each line once. This is
what lets a pass read only its share of one large file. Compressed files and parquet are read
whole (one partition each).

The frame and the report come from the same tasks, so computing them together reads each
part once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
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
from daskhps.data.source import DataSource, day_of, resolve_files
from daskhps.data.textfile import splittable
from daskhps.stages import stage_span
from daskhps.storage import file_size, stamp

__all__ = ["ClickLog", "Part", "read_click_log", "split_parts"]

log = logging.getLogger(__name__)


def _to_backend(frame: pd.DataFrame, backend: str) -> Any:
    if backend == "cudf":
        import cudf

        return cudf.DataFrame.from_pandas(frame)
    return frame


def _read(
    part: Part, schema: Schema, policy: BadRowPolicy, backend: str, warn: bool = True
) -> tuple[Any, pd.DataFrame]:
    with stage_span("read"):  # parse and validate too; the hashing inside is "hash"
        frame, report = read_shard(part.path, schema, policy, byte_range=part.byte_range, warn=warn)
        return _to_backend(frame, backend), report.to_frame()


@dataclass(frozen=True)
class Part:
    """What one partition reads: a whole file, or the lines that start in bytes
    ``[start, stop)`` of a plain-text file."""

    path: str
    start: int | None = None
    stop: int | None = None

    @property
    def byte_range(self) -> tuple[int, int] | None:
        return None if self.start is None or self.stop is None else (self.start, self.stop)

    @property
    def name(self) -> str:
        """The part in the plan's fingerprint: the path of a whole file, ``path[start:stop]``
        of a range (so plans of whole files keep the fingerprints they always had)."""
        r = self.byte_range
        return self.path if r is None else f"{self.path}[{r[0]}:{r[1]}]"


def split_parts(files: Sequence[str], block_size: int | None, schema: Schema) -> list[Part]:
    """Every file as one part, or as blocks of ``block_size`` bytes when it is plain text and
    larger than that."""
    if block_size is None or schema.format == "parquet":
        return [Part(f) for f in files]
    parts: list[Part] = []
    for f in files:
        size = file_size(f)
        if size <= block_size or not splittable(f):
            parts.append(Part(f))
            continue
        parts.extend(Part(f, a, min(a + block_size, size)) for a in range(0, size, block_size))
    return parts


@dataclass(frozen=True)
class ClickLog:
    """A parsed click log: the frame (one partition per part) and its bad-row report."""

    frame: dd.DataFrame
    report: dd.DataFrame  # BadRowReport.to_frame() rows of every part
    files: tuple[str, ...]
    schema: Schema
    backend: str
    parts: tuple[Part, ...] = ()  # what partition i reads (one per file when empty)
    # The delayed (frame, report) read of each part, from which ``frame`` is made: what
    # :meth:`map_parts` builds on (empty for a log not made by read_click_log).
    reads: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if not self.parts:
            object.__setattr__(self, "parts", tuple(Part(f) for f in self.files))

    @property
    def part_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts)

    def part_days(self) -> tuple[str | None, ...]:
        """The log day (``YYYY-MM-DD`` of its ``day=`` folder) of each partition, None for a
        file outside a day-partitioned layout."""
        return tuple(day_of(p.path) for p in self.parts)

    def partitions(self, where: slice) -> ClickLog:
        """The log of partitions ``where`` only (frame and parts alike)."""
        return dataclasses.replace(
            self,
            frame=self.frame.partitions[where],
            parts=self.parts[where],
            reads=self.reads[where],
        )

    def map_parts(self, fn: Callable[..., Any], *args: Any) -> ClickLog:
        """The log whose partition ``i`` is ``fn(frame_i, *args, i)``: ``i`` is bound to each
        part when the task is made, so a later selection of partitions keeps each part's own.
        (``map_partitions`` with ``partition_info`` does not: Dask moves a selection of
        partitions below it and renumbers them, so partition 2 alone is told it is 0.) The
        new frame's tasks follow the same read tasks as this log's frame: computed together,
        each part is read once."""
        if len(self.reads) != len(self.parts):
            raise ValueError("map_parts needs a log made by read_click_log")
        pieces = [delayed(fn, pure=True)(read[0], *args, i) for i, read in enumerate(self.reads)]
        frame = dd.from_delayed(pieces, meta=self.frame._meta, verify_meta=False)
        return dataclasses.replace(self, frame=frame)

    def persist(self) -> ClickLog:
        """Persist frame and report in one graph (each part is read once). Holds the whole
        log in the workers' memory: training streams it instead."""
        frame, report = dask.persist(self.frame, self.report)
        return dataclasses.replace(self, frame=frame, report=report)

    def compute_report(self) -> BadRowReport:
        rep = BadRowReport.from_frame(self.report.compute())
        rep.log_summary(log)
        return rep


def _token(part: Part, *args: Any) -> str:
    """Task key of reading one part: its file's path, size and modification time (an
    object's ETag) are part of it, so two logs never share a read task (nor does a file
    rewritten in place with its old one)."""
    # (-1, -1) for a file that is not there: reading it reports that.
    return dask.base.tokenize(part, stamp(part.path), *args)


def read_click_log(
    source: DataSource | str | Sequence[str],
    schema: Schema | str | None = None,
    bad_rows: BadRowPolicy | str | None = None,
    backend: str = "auto",
    block_size: int | None = None,
    warn: bool = True,
) -> ClickLog:
    """Lazily read every file of ``source`` into a :class:`ClickLog`.

    ``source`` is a :class:`DataSource`, or paths (files, directories, globs) together with
    ``schema`` (default Criteo) and ``bad_rows`` (default ``skip``). Paths that match nothing
    raise :class:`~daskhps.errors.DataError` right away; bad rows surface when computed.
    ``block_size``: read plain-text files larger than this many bytes in blocks (one
    partition each); None reads every file whole. ``warn`` as for
    :func:`~daskhps.data.parse.read_shard`.
    """
    if not isinstance(source, DataSource):
        paths = (source,) if isinstance(source, str) else tuple(map(str, source))
        source = DataSource(
            paths=paths,
            schema=load_schema(schema or "criteo"),
            bad_rows=(
                bad_rows
                if isinstance(bad_rows, BadRowPolicy)
                else BadRowPolicy.from_dict(bad_rows, prefix="bad_rows")
                if bad_rows is not None
                else BadRowPolicy()
            ),
        )
    files = resolve_files(source.paths, source.days, source.require_complete)
    backend = choose_backend(backend)
    schema_, policy = source.schema, source.bad_rows
    split = split_parts(files, block_size, schema_)
    parts = [
        delayed(_read, pure=True, nout=2)(
            part,
            schema_,
            policy,
            backend,
            warn,
            dask_key_name=f"read-shard-{i}-{_token(part, schema_, policy, backend, warn)}",
        )
        for i, part in enumerate(split)
    ]
    meta = _to_backend(empty_frame(schema_), backend)
    frame = dd.from_delayed([p[0] for p in parts], meta=meta, verify_meta=False)
    report = dd.from_delayed(
        [p[1] for p in parts], meta=BadRowReport().to_frame(), verify_meta=False
    )
    log.info(
        "click log: %d files in %d parts, schema %s, backend %s",
        len(files),
        len(split),
        schema_.name,
        backend,
    )
    return ClickLog(frame, report, tuple(files), schema_, backend, tuple(split), tuple(parts))

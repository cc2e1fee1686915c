"""Where click logs live: globs, directories and day-partitioned layouts, on local disk or in
object storage (any fsspec URL, :mod:`daskhps.storage`).

A day-partitioned log looks like this (what ``daskhps generate`` writes)::

    logs/
      day=2024-01-01/part-00000.tsv.gz
      day=2024-01-01/part-00001.tsv.gz
      day=2024-01-01/_SUCCESS          <- the day is complete
      day=2024-01-02/...

Files are always taken in sorted path order (day, then part), which is the order the pass plan
follows; names starting with ``_`` or ``.`` (markers, checksums) are never data.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator

from daskhps import storage
from daskhps.data.badrows import BadRowPolicy
from daskhps.data.schema import Schema, criteo_schema, schema_at
from daskhps.errors import DataError
from daskhps.options import Ctx, Options, Problem, join, shown

__all__ = ["SUCCESS", "DataSource", "complete", "day_of", "resolve_files"]

SUCCESS = "_SUCCESS"
_DAY = re.compile(r"(?:^|/)day=(\d{4}-\d{2}-\d{2})(?:/|$)")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_NOT_DATA = (".json", ".yaml", ".yml", ".crc")


def day_of(path: str) -> str | None:
    """The ``YYYY-MM-DD`` of a ``day=...`` folder in ``path``, or None."""
    m = _DAY.search(Path(path).as_posix())
    return m.group(1) if m else None


def _is_data(path: str) -> bool:
    name = os.path.basename(path)
    return not name.startswith(("_", ".")) and not name.endswith(_NOT_DATA)


@dataclass(frozen=True)
class DataSource:
    """A set of click-log files with their schema and bad-row policy.

    ``days`` keeps only ``day=`` partitions within ``[start, end]`` (inclusive);
    ``require_complete`` keeps only days whose folder holds a ``_SUCCESS`` marker.
    """

    paths: tuple[str, ...]
    schema: Schema = field(default_factory=criteo_schema)
    days: tuple[str, str] | None = None
    require_complete: bool = False
    bad_rows: BadRowPolicy = field(default_factory=BadRowPolicy)

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any], source: str = "<dict>", prefix: str = ""
    ) -> DataSource:
        """Click logs described by a mapping: :class:`TrainLogs`' keys, a ``schema`` (a builtin
        name, a file beside ``source`` or a mapping) and ``bad_rows``."""
        own = ("schema", "bad_rows")
        logs = TrainLogs.from_dict(
            {k: v for k, v in d.items() if k not in own} if isinstance(d, Mapping) else d,
            source,
            prefix,
        )
        schema = schema_at(d.get("schema", "criteo"), Ctx(source), join(prefix, "schema"))
        return logs.source(
            schema, BadRowPolicy.from_dict(d.get("bad_rows"), source, join(prefix, "bad_rows"))
        )


def _paths(value: Any) -> Any:
    return (
        (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list) else value
    )


def _days(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


class TrainLogs(Options):
    """The click logs a run trains on (the ``data.train`` section); with the data section's
    schema and bad-row policy they are a :class:`DataSource`."""

    paths: Annotated[
        tuple[str, ...],
        BeforeValidator(_paths),
        WithJsonSchema(
            {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
        ),
    ] = Field(json_schema_extra=shown("path or list", "required"))
    """Files, folders or globs."""
    days: Annotated[tuple[str, ...] | None, BeforeValidator(_days)] = Field(
        None, json_schema_extra=shown("[YYYY-MM-DD, YYYY-MM-DD]")
    )
    """Keep `day=` partitions in this range."""
    require_complete: bool = False
    """Keep only days with a `_SUCCESS` marker."""

    @field_validator("paths")
    @classmethod
    def _some(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        if not paths:
            raise Problem("", "a path or a non-empty list of paths")
        return paths

    @field_validator("days", mode="before")
    @classmethod
    def _a_range(cls, days: Any) -> Any:
        if days is not None and not (
            isinstance(days, (list, tuple))
            and len(days) == 2
            and all(isinstance(x, str) and _DATE.match(x) for x in days)
        ):
            raise Problem("", f"expected [YYYY-MM-DD, YYYY-MM-DD], got {days!r}")
        return days

    def source(self, schema: Schema, bad_rows: BadRowPolicy) -> DataSource:
        """These logs read with ``schema`` and ``bad_rows``."""
        days = (self.days[0], self.days[1]) if self.days else None
        return DataSource(self.paths, schema, days, self.require_complete, bad_rows)


def resolve_files(
    paths: str | Sequence[str],
    days: tuple[str, str] | None = None,
    require_complete: bool = False,
) -> list[str]:
    """Every data file under ``paths`` (files, directories or globs; local, or fsspec URLs
    such as ``s3://bucket/logs/day=*/``), sorted, local ones as absolute paths: a relative
    path means the same on the process that resolves it (the driver) and on every worker,
    whatever folder a worker was started in. Objects keep their full URLs.

    Raises :class:`DataError` when nothing matches, naming the paths and the filters, and
    :class:`~daskhps.errors.StorageError` when a store cannot be listed.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [str(paths)]
    found: set[str] = set()
    marked: set[str] = set()  # folders known to hold a _SUCCESS marker
    for p in paths:
        p = str(p)
        if storage.is_url(p):
            files, markers = _listed(p)
            found.update(files)
            marked.update(markers)
            continue
        p = storage.local_path(p)
        if any(ch in p for ch in "*?["):
            matches = glob.glob(p, recursive=True)
        elif os.path.isdir(p):
            matches = [str(f) for f in Path(p).rglob("*")]
        elif os.path.exists(p):
            matches = [p]
        else:
            matches = []
        found.update(os.path.abspath(m) for m in matches if os.path.isfile(m) and _is_data(m))
    files = sorted(found)
    why = ""
    if days is not None:
        files = [f for f in files if (d := day_of(f)) is not None and days[0] <= d <= days[1]]
        why = f" within days {days[0]}..{days[1]}"
    if require_complete:
        files = [f for f in files if complete(storage.folder_of(f), marked)]
        why += f" in folders with a {SUCCESS} marker"
    if not files:
        for p in paths:
            storage.check_bucket(str(p))
        raise DataError(
            f"no input files: {', '.join(storage.shown(str(p)) for p in paths)} matched "
            f"nothing{why}; check the path, the glob or the day range"
        )
    return files


def complete(folder: str, marked: set[str] | frozenset[str] = frozenset()) -> bool:
    """Whether ``folder`` (a local folder or a prefix in a store) holds a ``_SUCCESS``
    marker; ``marked``: folders a listing already saw one in."""
    if folder in marked:
        return True
    if not storage.is_url(folder):
        return os.path.exists(os.path.join(folder, SUCCESS))
    return storage.exists(f"{folder}/{SUCCESS}")


def _listed(url: str) -> tuple[list[str], set[str]]:
    """The data objects ``url`` names (an object, a folder listed recursively, or a glob)
    as full URLs, and the folders of the ``_SUCCESS`` markers the listing saw."""
    fs, path = storage.filesystem(url)
    try:
        if any(ch in path for ch in "*?["):
            infos = fs.glob(path, detail=True)
        else:
            try:
                info = fs.info(path)
            except FileNotFoundError:
                infos = {}
            else:
                infos = fs.find(path, detail=True) if info["type"] == "directory" else {path: info}
    except Exception as e:
        raise storage.failure(url, e, "list") from None
    files: list[str] = []
    markers: set[str] = set()
    for name, info in infos.items():
        if info.get("type") != "file":
            continue
        full = fs.unstrip_protocol(name)
        if os.path.basename(name) == SUCCESS:
            markers.add(storage.folder_of(full))
        elif _is_data(name):
            files.append(full)
    return files, markers

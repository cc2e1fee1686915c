"""Where click logs live: globs, directories and day-partitioned layouts.

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
from typing import Any

from daskhps.data._validate import check_keys, get
from daskhps.data.badrows import BadRowPolicy
from daskhps.data.schema import Schema, criteo_schema, load_schema
from daskhps.errors import ConfigError, DataError

__all__ = ["SUCCESS", "DataSource", "day_of", "resolve_files"]

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

    _KEYS = ("paths", "schema", "days", "require_complete", "bad_rows")

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any], source: str = "<dict>", prefix: str = ""
    ) -> DataSource:
        d = check_keys(d, cls._KEYS, source, prefix)
        p = f"{prefix}." if prefix else ""
        raw = get(d, "paths", (str, list), source, prefix)
        paths = [raw] if isinstance(raw, str) else raw
        if not paths or not all(isinstance(x, str) for x in paths):
            raise ConfigError(f"{source}: {p}paths: a path or a non-empty list of paths")
        base = Path(source).parent if Path(source).suffix in (".yaml", ".yml") else None
        schema_spec = get(d, "schema", (str, dict), source, prefix, "criteo")
        if isinstance(schema_spec, dict):
            schema = Schema.from_dict(schema_spec, source)
        else:
            schema = load_schema(schema_spec, base)
        days = get(d, "days", (list, type(None)), source, prefix, None)
        if days is not None:
            if len(days) != 2 or not all(isinstance(x, str) and _DATE.match(x) for x in days):
                raise ConfigError(
                    f"{source}: {p}days: expected [YYYY-MM-DD, YYYY-MM-DD], got {days!r}"
                )
            days = (days[0], days[1])
        return cls(
            paths=tuple(paths),
            schema=schema,
            days=days,
            require_complete=get(d, "require_complete", bool, source, prefix, False),
            bad_rows=BadRowPolicy.from_dict(d.get("bad_rows", {}), source, f"{p}bad_rows"),
        )


def resolve_files(
    paths: str | Sequence[str],
    days: tuple[str, str] | None = None,
    require_complete: bool = False,
) -> list[str]:
    """Every data file under ``paths`` (files, directories or globs), sorted.

    Raises :class:`DataError` when nothing matches, naming the paths and the filters.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [str(paths)]
    found: set[str] = set()
    for p in paths:
        p = str(p)
        if any(ch in p for ch in "*?["):
            matches = glob.glob(p, recursive=True)
        elif os.path.isdir(p):
            matches = [str(f) for f in Path(p).rglob("*")]
        elif os.path.exists(p):
            matches = [p]
        else:
            matches = []
        found.update(m for m in matches if os.path.isfile(m) and _is_data(m))
    files = sorted(found)
    why = ""
    if days is not None:
        files = [f for f in files if (d := day_of(f)) is not None and days[0] <= d <= days[1]]
        why = f" within days {days[0]}..{days[1]}"
    if require_complete:
        files = [f for f in files if os.path.exists(os.path.join(os.path.dirname(f), SUCCESS))]
        why += f" in folders with a {SUCCESS} marker"
    if not files:
        raise DataError(
            f"no input files: {', '.join(map(str, paths))} matched nothing{why}; "
            "check the path, the glob or the day range"
        )
    return files

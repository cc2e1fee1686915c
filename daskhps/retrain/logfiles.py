"""The data files of the logs a retraining job watches, as they are now (scheduled runs list
day partitions of them, a follower its chunks)."""

from __future__ import annotations

from collections.abc import Sequence

from daskhps import storage
from daskhps.data.source import resolve_files
from daskhps.errors import DataError

__all__ = ["watched_files"]


def watched_files(paths: str | Sequence[str], holds: str) -> list[str]:
    """Every data file under ``paths`` (folders, globs or URLs), sorted; none when the folders
    exist but hold no data yet.

    A path that does not exist raises :class:`DataError` naming ``holds`` (what the folder of
    ``data.train.paths`` is expected to hold): a typo must not read as "nothing new". Object
    storage is listed afresh, not from fsspec's listing cache, so what landed since the last
    listing is seen.
    """
    paths = [paths] if isinstance(paths, str) else list(paths)
    missing = [p for p in paths if not any(ch in p for ch in "*?[") and not storage.exists(p)]
    if missing:
        raise DataError(
            f"click-log path {', '.join(map(storage.shown, missing))} does not exist; check "
            f"data.train.paths ({holds})"
        )
    for p in paths:
        if storage.is_url(p):
            storage.filesystem(p)[0].invalidate_cache()
    try:
        return resolve_files(paths)
    except DataError:
        return []  # the folders exist but hold no data yet

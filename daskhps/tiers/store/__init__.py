"""The persistent bottom tier: one shard of one table in an append-only zarr v3 store.

Every upsert appends rows to an immutable *segment* (rows written together sit together);
nothing on disk is modified in place, so any earlier *commit* can be reopened and a crash
never damages committed state. The key -> location index lives in memory; commits persist it
as full snapshots every few commits and otherwise as the list of segments to replay, so a
commit costs what was written since the previous one, not the table size::

    upsert ──► buffer.py      the open segment, in memory ──seal──► segments/<id>/ (immutable)
    commit ──► chain.py       index snapshot or replay list; commits/<seq>.json last
    open   ◄── chain.py       snapshot + replay of segment key arrays = key -> location index
    lookup ◄── segments.py    rows read by location, one chunk file at a time
    compact ─► compaction.py  live rows of stale or small segments into new ones
    drop_commits ─► chain.py  keep the newest commits; delete files nothing kept uses

The modules, each with one job:

    layout.py      the folders and files (diagram there), row locations, the root metadata
    arrays.py      zarr v3 arrays written with zarr-python, read as raw chunk files
    durable.py     fsync and sha256 of files
    manifest.py    commit manifests: JSON files made visible by atomic rename
    segments.py    a segment's arrays; reading rows out of them
    buffer.py      the write buffer (the open segment)
    chain.py       the commit chain: snapshots, replay, manifests kept and dropped, garbage
    compaction.py  which segments a compaction rewrites
    reader.py      StoreReader: one commit, read-only; advances to a later commit
    writer.py      StoreWriter: a reader that also writes, holding the store's lock
    check.py       every problem of a commit's files, without opening the store

Open a store with :func:`open_store`: a :class:`StoreReader` for ``mode="r"``, a
:class:`StoreWriter` otherwise. Both implement :class:`~daskhps.tiers.base.PersistentStore`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from daskhps.errors import ConfigError
from daskhps.tiers.store.layout import StoreFolder
from daskhps.tiers.store.options import StoreOptions
from daskhps.tiers.store.reader import StoreReader
from daskhps.tiers.store.writer import StoreWriter, WriteMode

__all__ = ["Mode", "StoreOptions", "StoreReader", "StoreWriter", "open_store"]

Mode = Literal[WriteMode, "r"]


def open_store(
    path: str | os.PathLike[str],
    *,
    name: str,
    width: int,
    layout: dict[str, Any],
    mode: Mode = "a",
    commit: str | None = None,
    options: StoreOptions | None = None,
    overwrite: bool = False,
) -> StoreReader:
    """Open (or create) the store at ``path``: a :class:`StoreReader` for ``mode="r"``, a
    :class:`StoreWriter` (a reader that also writes) for the other modes.

    Parameters
    ----------
    path, name, width, layout:
        The store's folder, its tier name, floats per row and the description of its rows:
        see :class:`~daskhps.tiers.store.layout.StoreFolder` (the layout must match on every
        reopen).
    mode:
        ``"w"`` create (an existing store is an error unless ``overwrite``); ``"a"`` open for
        writing, creating the store if the path is missing or empty; ``"r+"`` open an existing
        store for writing; ``"r"`` read-only (no lock, never writes).
    commit:
        Open the state of this commit instead of the latest one. Writers continue from it;
        later commits stay on disk (and openable) until ``drop_commits``.
    options:
        How a writer writes (:class:`StoreOptions`: snapshots, chunk and buffer sizes);
        default: every default.
    overwrite:
        With ``mode="w"``, replace an existing store.

    Raises
    ------
    ConfigError
        An argument is invalid (nothing on disk is touched).
    """
    p = Path(path)
    where = f"{name}: opening {p}"
    if mode not in ("w", "a", "r+", "r"):
        raise ConfigError(f"{where}: mode must be 'w', 'a', 'r+' or 'r', got {mode!r}")
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ConfigError(f"{where}: width must be a positive integer, got {width!r}")
    options = StoreOptions() if options is None else options
    try:
        rows_layout = json.loads(json.dumps(layout))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: layout must be a JSON-able dict ({e})") from e
    if not isinstance(rows_layout, dict):
        raise ConfigError(f"{where}: layout must be a dict, got {type(layout).__name__}")
    if "width" in rows_layout and rows_layout["width"] != width:
        raise ConfigError(
            f"{where}: layout says width {rows_layout['width']} but width={width} was given"
        )
    if mode == "w" and commit is not None:
        raise ConfigError(f"{where}: mode='w' creates a new store, which has no commit")
    folder = StoreFolder(p, name, int(width), rows_layout)
    if mode == "r":
        return StoreReader(folder, commit)
    return StoreWriter(
        folder,
        commit,
        mode=mode,
        overwrite=overwrite,
        snapshot_every=options.snapshot_every,
        chunk_rows=options.chunk_rows,
        write_buffer_rows=options.write_buffer_rows,
    )

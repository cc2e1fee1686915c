"""The complete chunks of a click log that is still being written, for ``retrain --follow``.

A *chunk* is the unit the follower trains one version on. It is complete when no more rows will
be added to it::

    logs/day=2024-01-05/hour=07/part-0.tsv  part-1.tsv  _SUCCESS   one chunk: the folder
    logs/day=2024-01-05/hour=08/part-0.tsv                         waits for its _SUCCESS,
                                                                   or with require_complete
                                                                   off: one chunk, the file
    logs/incoming/part-1733400000.tsv                              one chunk: the file
    logs/incoming/.part-1733400060.tsv.tmp   logs/_temporary/...   never read (in progress)

- A folder with a ``_SUCCESS`` marker (a day, an hour, any folder) is one chunk of every data
  file directly in it: the pipeline that wrote it says it is done.
- A data file in a folder without a marker is a chunk of its own once it is visible: an object
  in object storage appears whole, and a file on a file system is renamed into place, the
  usual convention. With ``data.train.require_complete`` such files wait for their marker.
- A name starting with ``_`` or ``.`` anywhere below the watched path is never read: writers
  put what is in progress there (``.part.tmp``, Spark's ``_temporary/``).

Exactly once is decided file by file: a chunk's files that a version already trained on are
left out of it, so a folder whose marker lands after some of its files were taken one by one
adds only the rest. Chunks are taken oldest name first among those that are new in a listing:
a late chunk with an older date is trained when it lands, after what was trained before it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from daskhps import storage
from daskhps.data.source import complete, day_of
from daskhps.retrain.logfiles import watched_files

__all__ = ["Chunk", "list_chunks", "new_chunks"]


@dataclass(frozen=True)
class Chunk:
    """One complete chunk: its name (the marked folder, or the file) and its data files."""

    name: str
    files: tuple[str, ...]

    @property
    def day(self) -> str | None:
        """The ``day=`` partition it lies in (None outside day partitions)."""
        return day_of(self.name)


def _hidden_below(path: str, roots: Sequence[str]) -> bool:
    """Whether a folder between a watched root and ``path`` is named ``_...`` or ``.``..."""
    for root in roots:
        root = root.rstrip("/")
        if path.startswith(root + "/"):
            parts = path[len(root) + 1 :].split("/")[:-1]
            return any(p.startswith(("_", ".")) for p in parts)
    return False


def _roots(paths: Sequence[str]) -> list[str]:
    """The watched folders as :func:`resolve_files` spells the files under them."""
    out = []
    for p in paths:
        if storage.is_url(p):
            out.append(p)
        else:
            out.append(os.path.abspath(storage.local_path(p)))
    return out


def list_chunks(paths: str | Sequence[str], require_complete: bool = False) -> list[Chunk]:
    """Every complete chunk under ``paths`` (folders, globs or URLs), by name.

    A path that does not exist raises :class:`DataError` (a typo must not read as "nothing
    landed yet"); an existing folder with no data yet has no chunks.
    """
    paths = [paths] if isinstance(paths, str) else list(paths)
    files = watched_files(paths, "the folder the follower watches for new chunks")
    roots = _roots(paths)
    by_folder: dict[str, list[str]] = {}
    for f in files:
        if not _hidden_below(f, roots):
            by_folder.setdefault(storage.folder_of(f), []).append(f)
    chunks = []
    for folder, found in by_folder.items():
        if complete(folder):
            chunks.append(Chunk(folder, tuple(sorted(found))))
        elif not require_complete:
            chunks.extend(Chunk(f, (f,)) for f in found)
    return sorted(chunks, key=lambda c: c.name)


def new_chunks(chunks: Iterable[Chunk], taken: Collection[str]) -> list[Chunk]:
    """``chunks`` without the files in ``taken``; chunks left with no file are dropped."""
    out = []
    for c in chunks:
        rest = tuple(f for f in c.files if f not in taken)
        if rest:
            out.append(Chunk(c.name, rest))
    return out

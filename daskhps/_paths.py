"""Folders a command writes to or measures: is one writable (asked before anything is written,
so that a bad path ends in one line naming it instead of an errno deep inside a run or on a
worker), and how many bytes a tree holds."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from daskhps.errors import UnwritablePathError

__all__ = ["check_writable_dir", "tree_bytes"]


def check_writable_dir(path: str | os.PathLike[str], what: str, fix: str) -> Path:
    """Prove that ``path`` can be a folder that files are written to, and leave no trace.

    The missing folders of ``path`` are created, a file is written in it, and then both are
    removed again: only trying proves it (``os.access`` says yes to root under ``/proc``, and
    to a read-only mount's folders that look writable). Raises :class:`UnwritablePathError`:
    ``cannot write <what> to <path>: <why>; <fix>``.
    """
    p = Path(path)
    made: list[Path] = []  # folders this check created, removed again at the end
    step = "cannot read it"
    try:
        missing = []
        existing = p
        while not existing.exists() and existing != existing.parent:
            missing.append(existing)
            existing = existing.parent
        if not existing.is_dir():
            step = f"{existing} is a file, not a folder"
            raise NotADirectoryError(step)
        for folder in reversed(missing):
            step = f"cannot create the folder {folder}"
            try:
                folder.mkdir()
            except FileExistsError:  # made meanwhile by someone else: theirs to keep
                continue
            made.append(folder)
        step = "cannot create a file in it"
        fd, probe = tempfile.mkstemp(prefix=".daskhps-write-check-", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        why = f" ({e.strerror})" if e.strerror else ""
        raise UnwritablePathError(f"cannot write {what} to {p}: {step}{why}; {fix}") from None
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
    return p


def tree_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of the files under ``path`` (or of ``path`` itself, a file); files deleted while
    it walks count as gone."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.path.getsize(os.path.join(root, f))
    return total

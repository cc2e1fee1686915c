"""Folders a command writes to or measures: is one writable (asked before anything is written,
so that a bad path ends in one line naming it instead of an errno deep inside a run or on a
worker), how many bytes a tree holds, and how many its disk has free."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from daskhps.errors import UnwritablePathError

__all__ = ["check_writable_dir", "free_bytes", "tree_bytes", "writing_problem"]


def check_writable_dir(path: str | os.PathLike[str], what: str, fix: str) -> Path:
    """Prove that ``path`` can be a folder that files are written to, and leave no trace.

    The missing folders of ``path`` are created, a file is written in it, and then both are
    removed again: only trying proves it (``os.access`` says yes to root under ``/proc``, and
    to a read-only mount's folders that look writable). Raises :class:`UnwritablePathError`:
    ``cannot write <what> to <path>: <why>; <fix>``.

    Checks of one new path at once (the workers of a cluster that share a disk) would each
    remove folders the other is using, or leave one the other made: on one machine they take
    turns, and a folder that vanishes under a check (a disk shared by several machines) is
    tried again.
    """
    p = Path(path)
    problem = writing_problem(p)
    if problem is not None:
        raise UnwritablePathError(f"cannot write {what} to {p}: {problem}; {fix}")
    return p


def writing_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be a folder files are written to (the step that failed, and the
    error's reason), tried as :func:`check_writable_dir` does; None when it can."""
    p = Path(path)
    for attempt in range(_TRIES):
        try:
            with _one_check_at_a_time():
                _try_writing(p, last=attempt == _TRIES - 1)
            return None
        except _Vanished:
            time.sleep(0.001 * (attempt + 1))
        except _Refused as e:
            return str(e)
    raise AssertionError("unreachable: the last try refuses or passes")


_TRIES = 20
_TURN_WAIT_S = 5.0


@contextlib.contextmanager
def _one_check_at_a_time() -> Iterator[None]:
    """The checks of this machine take turns: an ``flock`` on ``/``, a folder no check
    creates or removes (and that needs no lock file); after a few seconds without a turn the
    check goes ahead anyway."""
    fd = os.open("/", os.O_RDONLY)
    try:
        deadline = time.monotonic() + _TURN_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)
            except OSError:  # a file system without flock: no turns
                break
        yield
    finally:
        os.close(fd)  # closing drops the lock


class _Vanished(Exception):
    """A folder of the path went while the check used it: another check's cleanup."""


class _Refused(Exception):
    """The path cannot be written; the message says which step failed and why."""


def _try_writing(p: Path, last: bool) -> None:
    """One try of :func:`check_writable_dir`; a folder that was there a moment ago and is
    gone (no such file or directory) is :class:`_Vanished` unless this is the ``last``."""
    made: list[Path] = []  # folders this check created, removed again at the end
    step = "cannot read it"
    try:
        missing = []
        existing = p
        while not existing.exists() and existing != existing.parent:
            missing.append(existing)
            existing = existing.parent
        # One look decides: is_dir() then exists() are two, and another check's cleanup and
        # its next try could remove and make the folder again between them (a folder that
        # looked like a file). Gone now: FileNotFoundError, tried again below.
        if not stat.S_ISDIR(existing.stat().st_mode):
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
    except FileNotFoundError as e:
        if not last:
            raise _Vanished() from None
        raise _Refused(f"{step}{_why(e)}") from None
    except OSError as e:
        raise _Refused(f"{step}{_why(e)}") from None
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()


def _why(e: OSError) -> str:
    return f" ({e.strerror})" if e.strerror else ""


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


def free_bytes(path: str | os.PathLike[str]) -> tuple[str, int]:
    """Free bytes of the file system that will hold ``path`` (its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p.parent != p:
        p = p.parent
    return str(p), shutil.disk_usage(p).free

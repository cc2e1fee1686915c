"""An exclusive, non-blocking ``flock`` on a file: the base of the store's single-writer lock
and the retraining run lock.

``flock`` belongs to the open file description, so the kernel drops it when the holder dies
(no stale locks after a crash) and a second open of the same file, even in the same process,
conflicts. The holder writes its pid and host into the file so a refused caller can say who
holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path
from typing import Self

__all__ = ["FileLock"]


class FileLock:
    """An exclusive lock on ``path``; subclasses say what a refusal raises (:meth:`refused`)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def refused(self, holder: str) -> Exception:
        """The error raised when another holder has the lock (``holder`` describes it)."""
        return BlockingIOError(f"{self.path} is locked ({holder})")

    def acquire(self) -> Self:
        """Take the lock, or raise :meth:`refused`'s error naming the holder."""
        if self._fd is not None:
            return self
        # Never truncate before holding the lock: the file names the current holder.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            holder = _read_holder(fd)
            os.close(fd)
            raise self.refused(holder) from e
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
        os.pwrite(
            fd, f"pid {os.getpid()} on host {socket.gethostname()} since {since}\n".encode(), 0
        )
        self._fd = fd
        return self

    def check_free(self) -> None:
        """Raise :meth:`refused`'s error when another process holds the lock; otherwise
        return, having written nothing (a reader that must not change a folder it reads,
        such as another run's stores)."""
        holder = self._holder()
        if holder is not None:
            raise self.refused(holder)

    def wait_free(self, deadline: float) -> Exception | None:
        """:meth:`check_free` every 0.1 s until the lock is free (None) or ``deadline`` (a
        ``time.monotonic()``) has passed: then :meth:`refused`'s error, naming the holder.
        Writes nothing either (the workers of a killed run let go of its stores a moment
        after it died)."""
        while (holder := self._holder()) is not None:
            if time.monotonic() >= deadline:
                return self.refused(holder)
            time.sleep(0.1)
        return None

    def _holder(self) -> str | None:
        """Who holds the lock (:func:`_read_holder`'s words); None when nobody does."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None  # never locked
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd)
        finally:
            os.close(fd)  # drops the shared lock too
        return None

    def release(self) -> None:
        """Release the lock (idempotent). The file stays: deleting it would race with a
        caller that has opened it but not yet locked it."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __del__(self) -> None:
        # A forgotten lock must not stay held for the rest of the process.
        with contextlib.suppress(Exception):  # modules may be gone at interpreter exit
            self.release()

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 256, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return f"holder: {text}" if text else "holder unknown"

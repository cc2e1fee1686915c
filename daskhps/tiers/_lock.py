"""The single-writer lock of a persistent store.

zarr loses data when two processes write the same chunk, and the store's in-memory index is
only correct if nobody else appends segments, so each store has exactly one writer. The lock
is an exclusive, non-blocking ``flock`` on a ``LOCK`` file inside the store. ``flock`` belongs
to the open file description, so the kernel drops it when the holder dies (no stale locks
after a crash) and a second open of the same file, even in the same process, conflicts.
The holder writes its pid and host into the file so a refused writer can say who holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path

from daskhps.errors import StoreLockedError

__all__ = ["WriterLock"]


class WriterLock:
    """An exclusive, non-blocking writer lock on ``<directory>/LOCK``.

    Parameters
    ----------
    directory:
        The store directory; it must exist.
    what:
        Names the locked thing in error messages (e.g. ``"store of table ads"``).
    """

    FILE = "LOCK"

    def __init__(self, directory: str | os.PathLike[str], what: str = "store") -> None:
        self.path = Path(directory) / self.FILE
        self.what = what
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> WriterLock:
        """Take the lock or raise :class:`StoreLockedError` naming the holder."""
        if self._fd is not None:
            return self
        # Never truncate on open: the holder's pid is in the file until we own the lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            holder = _read_holder(fd)
            os.close(fd)
            raise StoreLockedError(
                f"{self.what} at {self.path.parent} is locked by another writer ({holder}); "
                f"a store has exactly one writer: close the other writer (or wait for it to "
                f"exit), or open this one read-only with mode='r'"
            ) from e
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        info = f"pid {os.getpid()} on host {socket.gethostname()} since {time.time():.0f}\n"
        os.pwrite(fd, info.encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Release the lock (idempotent). The file stays: deleting it would race with a
        writer that has opened it but not yet locked it."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __del__(self) -> None:
        # A forgotten store must not stay locked for the rest of the process.
        with contextlib.suppress(Exception):  # modules may be gone at interpreter exit
            self.release()

    def __enter__(self) -> WriterLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 256, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return f"holder: {text}" if text else "holder unknown"

"""One retraining run (or rollback) per run directory at a time.

An exclusive, non-blocking ``flock`` on ``<run.dir>/retrain.lock``: a scheduler that starts a
run while yesterday's is still training gets an immediate refusal (exit code 5), never a
second writer of the stores or the registry. The kernel drops the lock when its holder dies,
so a killed run leaves no stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path

from daskhps.retrain.errors import RetrainLockedError

__all__ = ["RetrainLock"]


class RetrainLock:
    """The retraining lock of ``run_dir`` (created if missing); a context manager."""

    FILE = "retrain.lock"

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / self.FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RetrainLock:
        """Take the lock, or raise :class:`RetrainLockedError` naming the holder."""
        if self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Never truncate before holding the lock: the file names the current holder.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown holder"
            os.close(fd)
            raise RetrainLockedError(
                f"another retraining run holds {self.path} ({holder}); nothing was done: wait "
                "for it to finish (a scheduler should retry at its next tick)"
            ) from e
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Release the lock (idempotent); the file stays, as deleting it would race."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # modules may be gone at interpreter exit
            self.release()

    def __enter__(self) -> RetrainLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

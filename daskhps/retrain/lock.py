"""One retraining run (or rollback) per run directory at a time.

An exclusive, non-blocking ``flock`` on ``<run.dir>/retrain.lock``: a scheduler that starts a
run while yesterday's is still training gets an immediate refusal (exit code 5), never a
second writer of the stores or the registry. The kernel drops the lock when its holder dies,
so a killed run leaves no stale lock behind.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Self

from daskhps._flock import FileLock
from daskhps.retrain.errors import RetrainLockedError

__all__ = ["RetrainLock"]


class RetrainLock(FileLock):
    """The retraining lock of ``run_dir`` (created if missing); a context manager."""

    FILE = "retrain.lock"

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        super().__init__(Path(run_dir) / self.FILE)

    def acquire(self) -> Self:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return super().acquire()

    def refused(self, holder: str) -> Exception:
        return RetrainLockedError(
            f"another retraining run holds {self.path} ({holder}); nothing was done: wait "
            "for it to finish (a scheduler should retry at its next tick)"
        )

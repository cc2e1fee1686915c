"""The single-writer lock of a persistent store.

zarr loses data when two processes write the same chunk, and the store's in-memory index is
only correct if nobody else appends segments, so each store has exactly one writer: an
exclusive, non-blocking ``flock`` on a ``LOCK`` file inside the store (:class:`FileLock`).
"""

from __future__ import annotations

import os

from daskhps._flock import FileLock
from daskhps.errors import StoreLockedError

__all__ = ["WriterLock"]


class WriterLock(FileLock):
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
        super().__init__(os.path.join(directory, self.FILE))
        self.what = what

    def refused(self, holder: str) -> Exception:
        return StoreLockedError(
            f"{self.what} at {self.path.parent} is locked by another writer ({holder}); "
            f"a store has exactly one writer: close the other writer (or wait for it to "
            f"exit), or open this one read-only with mode='r'"
        )

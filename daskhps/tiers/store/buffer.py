"""The write buffer: the open segment, in memory until it is sealed (written to disk).

Small upserts (evictions in the middle of a pass) collect here: one zarr array per eviction
batch would cost milliseconds each and scatter a pass's rows over hundreds of tiny files. The
open segment has its id from its first row on, and its rows are indexed by that id like any
other segment's, so lookups read it through the same locations::

    upsert (small) ──► open segment <id>: keys[:n], rows[:n]  (a key at most once)
                             │ full, flush, commit, compact, drop_commits, or a large upsert
                             ▼
                       seal: segments/<id>/ on disk, under the id its rows are indexed by

Ids are allocated in write order, so replaying segments by id reproduces the index.
"""

from __future__ import annotations

import numpy as np
import torch

from daskhps.tiers.store.layout import offset_of, segment_of

__all__ = ["WriteBuffer"]


class WriteBuffer:
    """The open segment of a writer: up to ``capacity`` rows of ``width`` floats.

    Attributes
    ----------
    sid:
        The open segment's id, ``None`` while no row waits.
    n:
        Rows it holds.
    """

    def __init__(self, capacity: int, width: int) -> None:
        self.capacity = capacity
        self.sid: int | None = None
        self.n = 0
        self._keys = np.empty(0, dtype=np.int64)
        self._rows = np.empty((0, width), dtype=np.float32)

    def overwrite(
        self, keys: torch.Tensor, rows: torch.Tensor, locs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Replace, in place, the rows of the keys already here (``locs``: every key's
        location); returns the other keys and rows. A segment holds each key once, which
        replaying its key array relies on."""
        if self.sid is None:
            return keys, rows
        here = segment_of(locs) == self.sid
        if not bool(here.any()):
            return keys, rows
        self._rows[offset_of(locs[here]).numpy()] = rows[here].numpy()
        return keys[~here], rows[~here]

    def fits(self, n: int) -> bool:
        return self.n + n <= self.capacity

    def open(self, sid: int) -> None:
        """Start the open segment ``sid`` (none may be open)."""
        self.sid = sid
        if self._keys.shape[0] < self.capacity:
            self._keys = np.empty(self.capacity, dtype=np.int64)
            self._rows = np.empty((self.capacity, self._rows.shape[1]), dtype=np.float32)

    def append(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Add rows of keys not held yet, at offsets ``n, n + 1, ...`` (they must fit)."""
        a, n = self.n, int(keys.shape[0])
        self._keys[a : a + n] = keys.numpy()
        self._rows[a : a + n] = rows.numpy()
        self.n += n

    def contents(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and rows held, as views (no copy)."""
        return torch.from_numpy(self._keys[: self.n]), torch.from_numpy(self._rows[: self.n])

    def rows_at(self, offsets: np.ndarray) -> np.ndarray:
        return self._rows[offsets]

    def clear(self) -> None:
        """Forget the open segment (sealed, or dropped uncommitted)."""
        self.sid, self.n = None, 0

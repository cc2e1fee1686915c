"""Compaction: which segments to rewrite, and in which order their live rows move.

Segments are immutable, so overwritten rows stay on disk as long as their segment holds one
live row. Compaction copies the live rows of wasteful segments into new ones::

    segment   rows   live   stale          victim when
    3         1000     80   0.92           stale share >= min_stale
    7           12     12   0              fewer rows than merge_below (and two or more such)
    9         5000   4900   0.02           -

    live rows of 3 and 7, in location order ──► new segments of 16 chunks each
    3 and 7 leave the open state; deleted once no kept commit uses them

The writer moves the rows (:meth:`StoreWriter.compact`); this module decides.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from daskhps.tiers.store.layout import segment_of
from daskhps.tiers.store.segments import Segment

__all__ = ["CompactionPlan", "plan_compaction"]


@dataclass(frozen=True)
class CompactionPlan:
    """What a compaction does to an index whose entries are ``locs`` (any order).

    Attributes
    ----------
    live:
        Ids of the segments the index uses.
    victims:
        Those among them to rewrite.
    moves:
        Positions in ``locs`` of the rows to copy, in location order (their write order).
    """

    live: np.ndarray
    victims: np.ndarray
    moves: np.ndarray

    def batches(self, chunk_rows: int) -> Iterator[np.ndarray]:
        """The moves, in batches of one new segment each (16 chunk files)."""
        step = 16 * chunk_rows
        for a in range(0, self.moves.size, step):
            yield self.moves[a : a + step]


def plan_compaction(
    locs: np.ndarray, segments: Mapping[int, Segment], min_stale: float, merge_below: int
) -> CompactionPlan:
    """Victims: segments with at least ``min_stale`` of their rows stale, and segments with
    fewer than ``merge_below`` rows when there are two or more (rewriting one small segment
    alone merges nothing)."""
    seg_of = segment_of(locs)
    ids, live = np.unique(seg_of, return_counts=True)
    total = np.array([segments[int(s)].n for s in ids], dtype=np.int64)
    small = total < merge_below
    if small.sum() < 2:
        small[:] = False
    victims = ids[(1.0 - live / np.maximum(total, 1) >= min_stale) | small]
    moves = np.empty(0, dtype=np.int64)
    if victims.size:
        moves = np.flatnonzero(np.isin(seg_of, victims))
        moves = moves[np.argsort(locs[moves])]  # keep rows in their write order
    return CompactionPlan(ids, victims, moves)

"""The holdout, evaluated in chunks streamed from the parts the planning scan wrote.

::

    holdout parts (parquet, each on the disk of the worker that wrote it)
    chunk c = consecutive parts, at most ``chunk_rows`` rows (one part at least)
      on each worker holding parts of c: read them -> rank in the chunk -> split by the
                                   worker that evaluates each row (one task per worker)
      worker w:                    its pieces from every holder, concatenated, by rank
      all ranks:                   eval_pass (read-only lookups) -> predictions, labels
    chunk c+1 is read and routed while chunk c is evaluated; a chunk is released after it

A worker holds at most two chunks of holdout rows, whatever the holdout's size. Rows are cut
into global batches of ``batch_size`` (per worker) times the number of workers, as a pass's
examples are (:func:`daskhps.training.examples.worker_of_rank`). Predictions do not depend on
the batching: evaluation is read-only and the model is in eval mode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from daskhps.passes.scan import HoldoutPart, read_holdout_part
from daskhps.stages import stage_span
from daskhps.training.examples import RANK, worker_of_rank

__all__ = ["HoldoutStream", "chunk_parts"]

log = logging.getLogger(__name__)


def chunk_parts(parts: Sequence[HoldoutPart], max_rows: int) -> list[tuple[HoldoutPart, ...]]:
    """Consecutive parts in chunks of at most ``max_rows`` rows (a larger part alone); parts
    without rows are left out."""
    chunks: list[tuple[HoldoutPart, ...]] = []
    current: list[HoldoutPart] = []
    rows = 0
    for p in parts:
        if not p.rows:
            continue
        if current and rows + p.rows > max_rows:
            chunks.append(tuple(current))
            current, rows = [], 0
        current.append(p)
        rows += p.rows
    if current:
        chunks.append(tuple(current))
    return chunks


def _split(
    paths: list[str], firsts: list[int], n: int, batch_size: int, num_workers: int
) -> tuple[pd.DataFrame, ...]:
    """Parts on this worker's disk, part ``i`` ranked from ``firsts[i]`` in a chunk of ``n``
    rows, one frame per worker that evaluates them."""
    with stage_span("holdout"):
        frames = []
        for path, first in zip(paths, firsts, strict=True):
            df = read_holdout_part(path)
            df[RANK] = np.arange(first, first + len(df), dtype=np.int64)
            frames.append(df)
        df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        worker = worker_of_rank(df[RANK].to_numpy(), n, batch_size, num_workers)
        return tuple(df[worker == w].reset_index(drop=True) for w in range(num_workers))


def _piece(split: tuple[pd.DataFrame, ...], w: int) -> pd.DataFrame:
    return split[w]


def _gather(*pieces: pd.DataFrame) -> pd.DataFrame:
    """A worker's rows of a chunk, ranks ascending (batches are cut by rank)."""
    with stage_span("holdout"):
        df = pd.concat(pieces, ignore_index=True) if len(pieces) > 1 else pieces[0]
        return df.sort_values(RANK, kind="stable").reset_index(drop=True)


@dataclass
class _Placed:
    """One chunk's rows on their workers: ``futures[w]`` lives on worker ``w``."""

    futures: list[Any]
    rows: int
    num_batches: int


class HoldoutStream:
    """Evaluates the holdout chunk by chunk on every rank (see the module docstring).

    ``batch_size``: holdout rows per evaluation step over all workers. ``chunk_rows``: rows a
    chunk holds at most (over all workers).
    """

    def __init__(
        self,
        client: Any,
        parts: Sequence[HoldoutPart],
        addresses: Sequence[str],
        batch_size: int,
        chunk_rows: int,
    ) -> None:
        self.client = client
        self.addresses = list(addresses)
        self.batch_size = batch_size
        self.chunks = chunk_parts(parts, max(chunk_rows, batch_size))
        self.rows = sum(p.rows for c in self.chunks for p in c)

    def _place(self, chunk: tuple[HoldoutPart, ...]) -> _Placed:
        W, client = len(self.addresses), self.client
        n = sum(p.rows for p in chunk)
        # One reading task per worker that holds parts of the chunk (not one per part: a
        # small holdout fraction of a long log is many small parts).
        held: dict[str, tuple[list[str], list[int]]] = {}
        first = 0
        for p in chunk:
            paths, firsts = held.setdefault(p.address, ([], []))
            paths.append(p.path)
            firsts.append(first)
            first += p.rows
        splits = {
            address: client.submit(
                _split,
                paths,
                firsts,
                n,
                self.batch_size,
                W,
                workers=[address],  # the parts are on this worker's disk
                allow_other_workers=False,
                pure=False,
            )
            for address, (paths, firsts) in held.items()
        }
        futures = []
        for w, address in enumerate(self.addresses):
            pieces = [
                client.submit(_piece, s, w, workers=[holder], allow_other_workers=False, pure=False)
                for holder, s in splits.items()
            ]
            futures.append(
                client.submit(
                    _gather, *pieces, workers=[address], allow_other_workers=False, pure=False
                )
            )
        return _Placed(futures, n, -(-n // self.batch_size))

    def placed(self) -> Iterator[_Placed]:
        """Each chunk on its workers, the next one placed while the caller uses this one."""
        if not self.chunks:
            return
        ahead = self._place(self.chunks[0])
        for i in range(len(self.chunks)):
            current = ahead
            if i + 1 < len(self.chunks):
                ahead = self._place(self.chunks[i + 1])
            yield current
            del current  # released before the chunk after next is placed

    def evaluate(
        self, run_chunk: Callable[[_Placed], list[tuple[np.ndarray, np.ndarray]]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Predictions and labels of every holdout row: ``run_chunk(placed)`` evaluates one
        chunk on every rank and returns each rank's ``(predictions, labels)``."""
        preds: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        for placed in self.placed():
            for pred, label in run_chunk(placed):
                preds.append(pred)
                labels.append(label)
        if not preds:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        return np.concatenate(preds), np.concatenate(labels)

"""The planning scan: one streaming read of the log that counts its good rows and sets the
holdout aside.

::

    partition i of the log   read + parse + hash (one task, released when its readers ran)
        |-- training rows  -> len                     -> lengths[i]   (the plan's input)
        |-- bad-row report                            -> report       (logged, per pass)
        `-- holdout rows   -> parquet on the worker's disk  -> HoldoutPart(address, path, rows)

The three outputs come from the same read tasks in one computation, so each partition is read
and parsed once and nothing of it stays in memory afterwards. A fraction holdout is written
out here, so evaluating it later reads only the holdout rows (already parsed and hashed)
instead of the whole training log again; a holdout day is written the same way.

The holdout parts stay on the disk of the worker that wrote them (the folder is worker-local,
like the stores): :mod:`daskhps.training.holdout` reads each part on that worker.

With a ``keep`` window (plan positions of the first pass, known before the plan only as
``[0, examples_per_pass)``), the parsed partitions that overlap it stay on the workers that
read them (:class:`KeptReads`): the first pass's graph names the same read tasks, so Dask uses
them instead of reading and parsing those files a second time. A kept partition is no more
than what preparing that pass would hold anyway; one a worker loses is read again from its
file, as any lost task is.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from daskhps.data.badrows import BadRowReport
from daskhps.data.readers import ClickLog
from daskhps.stages import stage_span

__all__ = ["HoldoutPart", "KeptReads", "LogScan", "read_holdout_part", "remove_spill", "scan_log"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HoldoutPart:
    """Holdout rows of one partition, written to ``path`` on the worker at ``address``."""

    address: str
    path: str
    rows: int


@dataclass
class KeptReads:
    """Parsed training partitions the scan kept in the memory of the workers that read them:
    partition index -> the future of its read (the frame and bad-row report of that part)."""

    futures: dict[int, Any] = field(default_factory=dict)

    @property
    def partitions(self) -> tuple[int, ...]:
        return tuple(sorted(self.futures))

    def keep_only(self, lengths: Sequence[int], start: int, stop: int) -> None:
        """Let go of every partition that holds no plan position in ``[start, stop)`` (an
        empty one holds none)."""
        ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
        for i in list(self.futures):
            begin = int(ends[i]) - int(lengths[i])
            if not (lengths[i] and begin < stop and int(ends[i]) > start):
                del self.futures[i]

    def release(self) -> None:
        """Let go of them all (the first pass holds what it needs of them once placed)."""
        self.futures.clear()


@dataclass(frozen=True)
class LogScan:
    """What the planning scan found: good training rows per partition, the bad-row report,
    the holdout parts (empty without a holdout), and the partitions it kept parsed."""

    lengths: tuple[int, ...]
    report: BadRowReport
    holdout: tuple[HoldoutPart, ...] = ()
    kept: KeptReads = field(default_factory=KeptReads, compare=False)

    @property
    def holdout_rows(self) -> int:
        return sum(p.rows for p in self.holdout)


_SPILL_META = pd.DataFrame(
    {
        "address": pd.Series([], dtype="object"),
        "path": pd.Series([], dtype="object"),
        "rows": pd.Series([], dtype="int64"),
    }
)


def _spill(df: Any, folder: str, partition_info: Any = None) -> pd.DataFrame:
    """Write a partition's holdout rows to ``folder`` on this worker's disk."""
    from distributed import get_worker

    with stage_span("holdout"):
        number = partition_info["number"] if partition_info else 0
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"part-{number:06d}.parquet")
        frame = df.to_pandas() if hasattr(df, "to_pandas") else df  # cudf
        table = pa.Table.from_pandas(frame, preserve_index=False)
        tmp = f"{path}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, path)  # a part is there whole or not at all
        return pd.DataFrame({"address": [get_worker().address], "path": [path], "rows": [len(df)]})


def _lists_as_arrow(t: pa.DataType) -> Any:
    return pd.ArrowDtype(t) if pa.types.is_list(t) else None


def read_holdout_part(path: str) -> pd.DataFrame:
    """A holdout part as the parser made it (multi-hot columns as Arrow lists)."""
    return pq.read_table(path).to_pandas(types_mapper=_lists_as_arrow)


def remove_spill(folder: str | os.PathLike[str]) -> None:
    """Remove a spill folder (on the worker this runs on); missing is fine."""
    shutil.rmtree(folder, ignore_errors=True)


def _rows(length: Any) -> int:
    """A partition's ``len`` as ``to_delayed`` gives it: an int, or a Series of one."""
    return int(length.iloc[0]) if hasattr(length, "iloc") else int(length)


def _count_keeping(counts: list[Any], kept: KeptReads, start: int, stop: int) -> list[int]:
    """Good rows of each partition (``counts``, futures), keeping of the parsed partitions
    (``kept``, the only holder of their futures) those that hold plan positions in
    ``[start, stop)``. A partition is let go as soon as the rows counted before it reach
    ``stop``, in whatever order the counts come in: a slow first file does not hold every
    later one in memory. Which of the rest hold a position of the window is
    :meth:`KeptReads.keep_only`'s to say, once all are counted."""
    from distributed import as_completed

    which = {c.key: i for i, c in enumerate(counts)}
    known = np.zeros(len(counts), dtype=np.int64)
    for finished in as_completed(counts):
        known[which[finished.key]] = _rows(finished.result())
        before = np.cumsum(known) - known  # rows counted before each partition, so far
        for i in [i for i in kept.futures if before[i] >= stop]:
            del kept.futures[i]
    lengths = [int(n) for n in known]
    kept.keep_only(lengths, start, stop)
    return lengths


def scan_log(
    train: ClickLog,
    holdout: ClickLog | None,
    spill: Path | None,
    keep: tuple[int, int] | None = None,
) -> LogScan:
    """Count ``train``'s good rows per partition and write ``holdout``'s rows under ``spill``
    (on each worker's disk), on the current Dask client. ``keep``: plan
    positions ``(start, stop)`` whose parsed partitions stay on the workers (``LogScan.kept``)."""
    spilling: Any = None
    if holdout is not None:
        if spill is None:
            raise ValueError("a holdout needs a spill folder")
        spilling = holdout.frame.map_partitions(_spill, str(spill), meta=_SPILL_META)
    kept = KeptReads()
    if keep is not None and len(train.reads) == len(train.parts):
        from distributed import default_client

        client = default_client()
        # the read tasks under their own keys; ``kept`` alone holds them, so that letting go
        # of one frees it
        kept = KeptReads(dict(enumerate(client.compute(list(train.reads), optimize_graph=False))))
        # counted on the training frame, not the reads: a fraction holdout takes rows out
        counts = client.compute(train.frame.map_partitions(len).to_delayed())
        reporting = client.compute(train.report)
        # A holdout cut from the training files spills from the same reads, so alongside;
        # a holdout of its own files once the training log is counted, so that a bad row
        # there stops the run before any of it is written (its folder goes with the run).
        shared = holdout is not None and {r.key for r in holdout.reads} & {
            r.key for r in train.reads
        }
        spilled = client.compute(spilling) if shared else None
        lengths = _count_keeping(counts, kept, *keep)
        if spilling is not None and spilled is None:
            spilled = client.compute(spilling)
        out = [reporting.result(), spilled.result() if spilled is not None else None]
    else:
        todo = [train.report] if spilling is None else [train.report, spilling]
        lengths, *out = dask.compute(train.frame.map_partitions(len), *todo)
    parts: tuple[HoldoutPart, ...] = ()
    if holdout is not None:
        spilled = out[1]
        parts = tuple(
            HoldoutPart(str(a), str(p), int(n))
            for a, p, n in zip(spilled["address"], spilled["path"], spilled["rows"], strict=True)
        )
    report = BadRowReport.from_frame(out[0])
    return LogScan(tuple(int(x) for x in lengths), report, parts, kept)

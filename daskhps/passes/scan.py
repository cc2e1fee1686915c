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
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from daskhps.data.badrows import BadRowReport
from daskhps.data.readers import ClickLog
from daskhps.stages import stage_span

__all__ = ["HoldoutPart", "LogScan", "read_holdout_part", "remove_spill", "scan_log"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HoldoutPart:
    """Holdout rows of one partition, written to ``path`` on the worker at ``address``."""

    address: str
    path: str
    rows: int


@dataclass(frozen=True)
class LogScan:
    """What the planning scan found: good training rows per partition, the bad-row report,
    and the holdout parts (empty without a holdout)."""

    lengths: tuple[int, ...]
    report: BadRowReport
    holdout: tuple[HoldoutPart, ...] = ()

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


def scan_log(train: ClickLog, holdout: ClickLog | None, spill: Path | None) -> LogScan:
    """Count ``train``'s good rows per partition and write ``holdout``'s rows under ``spill``
    (on each worker's disk), in one computation on the current Dask client."""
    lengths = train.frame.map_partitions(len)
    todo: list[Any] = [lengths, train.report]
    if holdout is not None:
        if spill is None:
            raise ValueError("a holdout needs a spill folder")
        todo.append(holdout.frame.map_partitions(_spill, str(spill), meta=_SPILL_META))
    out = dask.compute(*todo)
    parts: tuple[HoldoutPart, ...] = ()
    if holdout is not None:
        spilled = out[2]
        parts = tuple(
            HoldoutPart(str(a), str(p), int(n))
            for a, p, n in zip(spilled["address"], spilled["path"], spilled["rows"], strict=True)
        )
    report = BadRowReport.from_frame(out[1])
    return LogScan(tuple(int(x) for x in out[0]), report, parts)

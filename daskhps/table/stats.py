"""The statistics every row carries after its optimizer state: how often its key occurred in
the training logs, and the last log day it occurred on.

A row of a table is laid out as ``[ embedding(dim) | optimizer state | count | last_day ]``
(:mod:`daskhps.table.optimizers` for the state). The two statistics are int32 bit patterns in
float32 slots, as Adam's step count is: a float32 counts exactly only up to 2**24, an int32 to
2**31 - 1. Because they sit in the row, every tier, checkpoint, re-shard, warm start and
serving replay moves them with the row, bit for bit.

- ``count``: the key's occurrences in every example trained on, not decayed (one row of a
  log with the key in two fields, or twice in a multi-hot field, counts each). Decay would
  make the count depend on when it was read, and an exact count is what admission
  thresholds and LFU scores compare. It saturates at 2**31 - 1 instead of wrapping.
- ``last_day``: the log day (``datetime.date.toordinal()``) of the latest pass that held the
  key, or :data:`NO_DAY` when it is not known: a row never counted, or one written before
  rows had statistics (a store of format 1 reads them as 0).

Everything here is vectorised over a block of rows.
"""

from __future__ import annotations

import datetime as dt

import torch

__all__ = [
    "COUNT_MAX",
    "NO_DAY",
    "STATS_WIDTH",
    "STAT_COLUMNS",
    "day_number",
    "day_string",
    "record",
    "row_stats",
]

STAT_COLUMNS = ("count", "last_day")
STATS_WIDTH = len(STAT_COLUMNS)
NO_DAY = 0  # no date has ordinal 0: 0001-01-01 is 1
COUNT_MAX = (1 << 31) - 1


def day_number(day: str | dt.date) -> int:
    """The ``last_day`` value of a log day (``YYYY-MM-DD`` or a date)."""
    if isinstance(day, str):
        day = dt.date.fromisoformat(day)
    return day.toordinal()


def day_string(number: int) -> str | None:
    """The ``YYYY-MM-DD`` of a ``last_day`` value, ``None`` for :data:`NO_DAY`."""
    return None if number == NO_DAY else dt.date.fromordinal(number).isoformat()


def row_stats(rows: torch.Tensor, stats_at: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(count, last_day)`` of a block of full rows, as int32 views (writing them writes the
    rows). ``stats_at`` is the column of ``count`` (:attr:`TableSpec.stats_at`)."""
    bits = rows[:, stats_at : stats_at + STATS_WIDTH].view(torch.int32)
    return bits[:, 0], bits[:, 1]


def record(
    rows: torch.Tensor, stats_at: int, counts: torch.Tensor, days: torch.Tensor | int | None
) -> None:
    """Add ``counts`` (one per row, >= 0) to the rows' counts, saturating at
    :data:`COUNT_MAX`, and move their ``last_day`` to ``days`` (one per row, or one for all)
    unless it is later already (a pass of an older day replayed). :data:`NO_DAY` or ``None``
    (logs without days) leaves ``last_day`` as it is. In place."""
    count, last = row_stats(rows, stats_at)
    total = count.to(torch.int64) + counts.to(device=rows.device, dtype=torch.int64)
    count.copy_(total.clamp_(max=COUNT_MAX).to(torch.int32))
    if days is not None:
        day = torch.as_tensor(days, dtype=torch.int32, device=rows.device)
        last.copy_(torch.maximum(last, day))

"""Split a click log into training rows and held-out evaluation rows.

Here in data/, below both its users: the trainer reads its logs with it and ``daskhps plan
--scan`` counts keys over the same rows (capacity/keystats.py), so capacity does not import
training.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import pandas as pd

from daskhps.data.readers import ClickLog, read_click_log
from daskhps.data.source import DataSource, day_of, resolve_files
from daskhps.errors import DataError

__all__ = ["Holdout", "read_train_and_holdout"]


class Holdout(Protocol):
    """What the split reads of a holdout: one ``day`` (``last`` or ``YYYY-MM-DD``), a
    ``fraction`` of rows chosen by ``seed``, or the training rows (``progressive``). The run
    config's ``data.holdout`` section (:class:`~daskhps.config.data.HoldoutConfig`, which
    config composes above data/) is one."""

    @property
    def day(self) -> str | None: ...
    @property
    def fraction(self) -> float | None: ...
    @property
    def seed(self) -> int: ...
    @property
    def progressive(self) -> bool: ...


def _keep(df: pd.DataFrame, fraction: float, seed: int, held: bool, part: int) -> pd.DataFrame:
    """Rows chosen by a hash of (seed, part, row): the same rows on every run, whichever of
    the log's parts a pass reads (``part`` is the part's position in the whole log)."""
    u = np.random.default_rng([seed, part]).random(len(df))
    return df[(u < fraction) == held]


def read_train_and_holdout(
    source: DataSource,
    holdout: Holdout | None,
    backend: str = "auto",
    block_size: int | None = None,
    summarised: bool = False,
) -> tuple[ClickLog, ClickLog | None]:
    """The training log and the holdout log (None without a holdout); ``block_size`` as
    :func:`~daskhps.data.readers.read_click_log` takes it. ``summarised``: the caller logs
    the training log's :meth:`~daskhps.data.badrows.BadRowReport.log_summary`, which names
    its truncated files, so reading them does not."""
    kw: dict[str, Any] = {
        "schema": source.schema,
        "bad_rows": source.bad_rows,
        "backend": backend,
        "block_size": block_size,
    }
    # A reader that re-reads the rows (the passes re-read what the planning scan read) names
    # a truncated file once, in the report's summary, not at every read of it.
    kw["warn"] = not summarised
    if holdout is None:
        return read_click_log(source, **kw), None
    if holdout.progressive:  # the same rows: scored, then trained on
        return read_click_log(source, **kw), read_click_log(source, **{**kw, "warn": False})
    if holdout.day is not None:
        files = resolve_files(source.paths, source.days, source.require_complete)
        days = sorted({d for f in files if (d := day_of(f)) is not None})
        if not days:
            raise DataError(
                f"holdout.day needs day partitions (day=YYYY-MM-DD/...), but none of "
                f"{list(source.paths)} has any: use holdout.fraction instead"
            )
        day = days[-1] if holdout.day == "last" else holdout.day
        if day not in days:
            raise DataError(f"holdout day {day} is not among the input's days ({', '.join(days)})")
        train = [f for f in files if day_of(f) != day]
        held = [f for f in files if day_of(f) == day]
        if not train:
            raise DataError(f"holding out {day} leaves no day to train on")
        return read_click_log(train, **kw), read_click_log(held, **{**kw, "warn": True})
    assert holdout.fraction is not None
    log = read_click_log(source, **kw)
    return (
        log.map_parts(_keep, holdout.fraction, holdout.seed, False),
        log.map_parts(_keep, holdout.fraction, holdout.seed, True),
    )

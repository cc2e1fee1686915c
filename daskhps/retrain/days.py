"""Day partitions of a click log, and which of them the next retraining run uses.

A day is *complete* when every folder holding its files has a ``_SUCCESS`` marker (what
``daskhps generate`` and most log pipelines write last). A run trains from the published
version on the complete days after the last day that version was trained on, except the
newest complete day, which it scores both models on::

    published version: trained through 01-03, scored on 01-04
    on disk:   01-04 ok   01-05 ok   01-06 (no _SUCCESS: being written)
    next run:  train 01-04   score 01-05   ignore 01-06

Days are taken in order up to the first incomplete one: a late day holds back the days after
it, so it is never skipped for good once it completes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from daskhps import storage
from daskhps.data.source import SUCCESS, complete, day_of
from daskhps.retrain.logfiles import watched_files

__all__ = ["Day", "DayPlan", "plan_days", "scan_days"]


@dataclass(frozen=True)
class Day:
    """One ``day=YYYY-MM-DD`` partition: its data files and whether it is complete."""

    day: str
    files: tuple[str, ...]
    complete: bool


@dataclass(frozen=True)
class DayPlan:
    """What the next run does: train on ``train``, score on ``eval_day``; or nothing, and why.

    ``ignored`` lists days newer than the published version that this run leaves out
    (incomplete days, and complete days behind one).
    """

    train: tuple[str, ...] = ()
    eval_day: str | None = None
    ignored: tuple[str, ...] = ()
    reason: str = ""

    @property
    def has_work(self) -> bool:
        return bool(self.train) and self.eval_day is not None


def scan_days(paths: str | Sequence[str]) -> list[Day]:
    """Every day partition under ``paths`` (folders or globs), oldest first.

    Files outside ``day=`` folders are not part of any day and are left out. Raises
    :class:`DataError` when a path does not exist (a typo must not read as "no new data").
    """
    files = watched_files(paths, "the folder that holds the day=YYYY-MM-DD/ partitions")
    by_day: dict[str, list[str]] = {}
    for f in files:
        d = day_of(f)
        if d is not None:
            by_day.setdefault(d, []).append(f)
    days = []
    for d in sorted(by_day):
        folders = {storage.folder_of(f) for f in by_day[d]}
        days.append(Day(d, tuple(by_day[d]), all(complete(folder) for folder in folders)))
    return days


def plan_days(
    days: Sequence[Day], trained_through: str | None, seen_through: str | None
) -> DayPlan:
    """The days of the next run.

    Parameters
    ----------
    days:
        Every day partition, as :func:`scan_days` returns them.
    trained_through:
        The last day the published version was trained on; None when nothing is published
        (then every complete day but the newest is trained on).
    seen_through:
        The newest day any earlier run scored on (published or rejected): a run happens only
        when a complete day newer than it exists, so a rerun without new data does nothing.
    """
    newer = [
        d
        for d in sorted(days, key=lambda d: d.day)
        if not trained_through or d.day > trained_through
    ]
    usable: list[str] = []
    for d in newer:
        if not d.complete:
            break
        usable.append(d.day)
    ignored = tuple(d.day for d in newer if d.day not in usable)
    after = f"after {trained_through} (the published version's last training day)"
    where = after if trained_through else "on disk"
    if ignored:
        hold = f"; ignored: {', '.join(ignored)} (no {SUCCESS} marker, or behind such a day)"
    else:
        hold = ""
    if not usable:
        return DayPlan(ignored=ignored, reason=f"no complete day {where}{hold}")
    newest = usable[-1]
    if seen_through is not None and newest <= seen_through:
        return DayPlan(
            ignored=ignored,
            reason=f"no new complete day: the newest, {newest}, was scored by an earlier run"
            f" ({seen_through}){hold}",
        )
    if len(usable) < 2:
        return DayPlan(
            eval_day=None,
            ignored=ignored,
            reason=f"only one complete day {where} ({newest}): a run needs one to train on and "
            f"a newer one to score on{hold}",
        )
    return DayPlan(train=tuple(usable[:-1]), eval_day=newest, ignored=ignored)

"""Day discovery and the choice of days of the next run, on real day folders (no cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from daskhps.data.source import SUCCESS
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.errors import DataError
from daskhps.retrain.days import Day, plan_days, scan_days


def _day(root: Path, day: str, complete: bool = True, parts: int = 2) -> None:
    folder = root / f"day={day}"
    folder.mkdir(parents=True)
    for p in range(parts):
        (folder / f"part-{p:05d}.tsv").write_text("1\t" + "\t" * 38 + "\n")
    if complete:
        (folder / SUCCESS).write_text("")


def test_scan_generated_logs(tmp_path: Path) -> None:
    cfg = GeneratorConfig(days=3, rows_per_day=200, parts_per_day=2, vocab_scale=0.01)
    generate(cfg, str(tmp_path))
    (tmp_path / "day=2024-01-03" / SUCCESS).unlink()  # still being written
    days = scan_days(str(tmp_path))
    assert [d.day for d in days] == ["2024-01-01", "2024-01-02", "2024-01-03"]
    assert [d.complete for d in days] == [True, True, False]
    assert all(len(d.files) == 2 and all("part-" in f for f in d.files) for d in days)


def test_scan_ignores_markers_and_loose_files(tmp_path: Path) -> None:
    _day(tmp_path, "2024-02-01")
    (tmp_path / "generation.json").write_text("{}")
    (tmp_path / "notes.tsv").write_text("x")  # not inside a day folder
    days = scan_days([str(tmp_path)])
    assert days == [
        Day(
            "2024-02-01",
            tuple(sorted(str(p) for p in (tmp_path / "day=2024-02-01").glob("part-*"))),
            True,
        )
    ]


def test_scan_empty_folder_and_missing_path(tmp_path: Path) -> None:
    assert scan_days(str(tmp_path)) == []
    with pytest.raises(DataError, match=r"does-not-exist.*data\.train\.paths"):
        scan_days(str(tmp_path / "does-not-exist"))


def test_day_complete_only_when_every_folder_is(tmp_path: Path) -> None:
    _day(tmp_path / "a", "2024-01-01")
    _day(tmp_path / "b", "2024-01-01", complete=False)
    (days,) = [scan_days([str(tmp_path / "a"), str(tmp_path / "b")])]
    assert len(days) == 1 and len(days[0].files) == 4 and not days[0].complete


def D(day: str, complete: bool = True) -> Day:
    return Day(day, (f"day={day}/part-0",), complete)


def test_first_run_trains_on_all_but_the_newest() -> None:
    plan = plan_days([D("2024-01-03"), D("2024-01-01"), D("2024-01-02")], None, None)
    assert plan.has_work
    assert plan.train == ("2024-01-01", "2024-01-02") and plan.eval_day == "2024-01-03"


def test_incomplete_newest_day_is_ignored() -> None:
    days = [D("2024-01-01"), D("2024-01-02"), D("2024-01-03", complete=False)]
    plan = plan_days(days, None, None)
    assert plan.train == ("2024-01-01",) and plan.eval_day == "2024-01-02"
    assert plan.ignored == ("2024-01-03",)


def test_a_late_day_holds_back_later_ones() -> None:
    days = [D("2024-01-01"), D("2024-01-02", complete=False), D("2024-01-03")]
    plan = plan_days(days, None, None)
    assert not plan.has_work and plan.ignored == ("2024-01-02", "2024-01-03")
    assert "only one complete day" in plan.reason and "2024-01-02" in plan.reason


def test_trains_from_the_published_version() -> None:
    days = [D(f"2024-01-0{i}") for i in range(1, 6)]
    # published: trained through 01-03, scored on 01-04; 01-05 is new
    plan = plan_days(days, "2024-01-03", "2024-01-04")
    assert plan.train == ("2024-01-04",) and plan.eval_day == "2024-01-05"


def test_nothing_new_when_the_newest_day_was_scored() -> None:
    days = [D(f"2024-01-0{i}") for i in range(1, 5)]
    plan = plan_days(days, "2024-01-03", "2024-01-04")
    assert not plan.has_work and plan.train == () and plan.eval_day is None
    assert "no new complete day" in plan.reason and "2024-01-04" in plan.reason


def test_after_a_rejection_the_next_run_trains_on_the_rejected_day_too() -> None:
    days = [D(f"2024-01-0{i}") for i in range(1, 7)]
    # published trained through 01-03; a candidate scored on 01-05 was rejected
    plan = plan_days(days, "2024-01-03", "2024-01-05")
    assert plan.train == ("2024-01-04", "2024-01-05") and plan.eval_day == "2024-01-06"


def test_not_enough_days() -> None:
    assert "no complete day on disk" in plan_days([], None, None).reason
    plan = plan_days([D("2024-01-01")], None, None)
    assert not plan.has_work and "only one complete day" in plan.reason
    plan = plan_days([D("2024-01-01"), D("2024-01-02")], "2024-01-02", "2024-01-02")
    assert not plan.has_work and "after 2024-01-02" in plan.reason

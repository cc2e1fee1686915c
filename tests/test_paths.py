"""A folder daskhps must write to is checked by trying, and the check leaves nothing behind."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from daskhps._paths import check_writable_dir
from daskhps.errors import DaskHPSError, UnwritablePathError

FIX = "choose a writable --out"


def test_a_new_nested_folder_passes_and_is_not_left_behind(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    assert check_writable_dir(target, "predictions", FIX) == target
    assert list(tmp_path.iterdir()) == []  # neither the folders nor the probe file stay


def test_an_existing_folder_keeps_only_what_it_held(tmp_path: Path) -> None:
    (tmp_path / "kept.txt").write_text("x")
    check_writable_dir(tmp_path, "predictions", FIX)
    assert [p.name for p in tmp_path.iterdir()] == ["kept.txt"]


def test_a_file_on_the_way_is_named(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    target = tmp_path / "afile" / "sub"
    with pytest.raises(UnwritablePathError) as e:
        check_writable_dir(target, "predictions", FIX)
    assert str(e.value) == (
        f"cannot write predictions to {target}: {tmp_path / 'afile'} is a file, not a folder; {FIX}"
    )
    assert isinstance(e.value, DaskHPSError) and isinstance(e.value, OSError)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_folder_that_cannot_be_created_is_named_even_for_root() -> None:
    """Root may write almost anywhere, so os.access says yes to /proc; only trying says no."""
    with pytest.raises(UnwritablePathError, match=r"^cannot write the run to /proc/daskhps-x/y: "):
        check_writable_dir("/proc/daskhps-x/y", "the run", "set run.dir to a writable folder")
    with pytest.raises(UnwritablePathError, match="cannot create a file in it"):
        check_writable_dir("/proc/self", "the run", "set run.dir to a writable folder")


def _check_at_once(target: Path, threads: int = 4, times: int = 200) -> list[str]:
    """Check ``target`` from ``threads`` threads ``times`` each; the refusals."""
    import threading

    failures: list[str] = []

    def check() -> None:
        for _ in range(times):
            try:
                check_writable_dir(target, "the stores", FIX)
            except UnwritablePathError as e:
                failures.append(str(e))

    running = [threading.Thread(target=check) for _ in range(threads)]
    for t in running:
        t.start()
    for t in running:
        t.join()
    return failures


def test_checks_of_one_new_folder_at_once_do_not_fail_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers sharing a disk check the same new folder at once: on one machine they take
    turns (nothing fails, nothing stays); across machines (no turns) a folder removed under a
    check by another one's cleanup is tried again, not a folder that cannot be written."""
    target = tmp_path / "stores" / "attempt" / "table"
    assert _check_at_once(target) == []
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr("daskhps._paths._one_check_at_a_time", contextlib.nullcontext)
    assert _check_at_once(target) == []

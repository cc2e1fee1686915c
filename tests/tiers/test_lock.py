"""The single-writer lock: exclusive per open file, across processes, gone with its holder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daskhps.errors import DaskHPSError, StoreLockedError
from daskhps.tiers.lock import WriterLock


def test_second_lock_in_same_process_conflicts(tmp_path: Path) -> None:
    first = WriterLock(tmp_path, "store of t/zarr").acquire()
    with pytest.raises(StoreLockedError) as info:
        WriterLock(tmp_path, "store of t/zarr").acquire()
    msg = str(info.value)
    assert f"pid {os.getpid()}" in msg
    assert str(tmp_path) in msg
    assert "mode='r'" in msg  # says what to do
    assert isinstance(info.value, BlockingIOError) and isinstance(info.value, DaskHPSError)
    first.release()
    again = WriterLock(tmp_path).acquire()  # released: free again
    again.release()


def test_release_is_idempotent_and_keeps_the_file(tmp_path: Path) -> None:
    with WriterLock(tmp_path) as lock:
        assert lock.held
    assert not lock.held
    lock.release()
    assert (tmp_path / WriterLock.FILE).exists()


def _child(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_other_process_is_refused_while_held(tmp_path: Path) -> None:
    with WriterLock(tmp_path):
        child = _child(
            f"""
            from daskhps.errors import StoreLockedError
            from daskhps.tiers.lock import WriterLock
            try:
                WriterLock({str(tmp_path)!r}).acquire()
                print("acquired")
            except StoreLockedError as e:
                print("refused:", e)
            """
        )
        out, err = child.communicate(timeout=60)
    assert out.startswith("refused:"), (out, err)
    assert f"pid {os.getpid()}" in out


def test_lock_dies_with_its_holder(tmp_path: Path) -> None:
    child = _child(
        f"""
        import os
        from daskhps.tiers.lock import WriterLock
        WriterLock({str(tmp_path)!r}).acquire()
        print("held", flush=True)
        os._exit(0)  # no release: the kernel drops the flock with the process
        """
    )
    out, err = child.communicate(timeout=60)
    assert out.strip() == "held", err
    with WriterLock(tmp_path) as lock:
        assert lock.held


def test_wait_free_names_the_holder_at_the_deadline_and_returns_once_it_lets_go(
    tmp_path: Path,
) -> None:
    import threading
    import time

    held = WriterLock(tmp_path, "store of t/zarr").acquire()
    refused = WriterLock(tmp_path, "store of t/zarr").wait_free(time.monotonic() + 0.3)
    assert isinstance(refused, StoreLockedError) and f"pid {os.getpid()}" in str(refused)
    threading.Timer(0.3, held.release).start()
    t = time.monotonic()
    assert WriterLock(tmp_path).wait_free(t + 30) is None  # let go after about 0.3 s
    assert time.monotonic() - t < 10
    assert WriterLock(tmp_path / "never-locked").wait_free(0.0) is None

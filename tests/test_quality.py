"""Lint, format and type checks run with the suite, so the README's one test command covers them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_ruff_lint() -> None:
    res = _run("ruff", "check", ".")
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format() -> None:
    res = _run("ruff", "format", "--check", ".")
    assert res.returncode == 0, res.stdout + res.stderr


class Mypy:
    """``mypy`` (the package, as pyproject.toml configures it) started when the suite is
    collected and read when :func:`test_mypy` runs: without a cache it takes half a minute of
    one core, which the suite's waits on its clusters and subprocesses leave idle. Niced, so
    the tests run first where both want the core."""

    proc: subprocess.Popen[str] | None = None

    @classmethod
    def start(cls) -> None:
        if cls.proc is None:
            cls.proc = subprocess.Popen(
                [sys.executable, "-m", "mypy"],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                preexec_fn=lambda: os.nice(10),
            )

    @classmethod
    def result(cls) -> tuple[int, str]:
        cls.start()
        assert cls.proc is not None
        out, _ = cls.proc.communicate(timeout=900)
        return cls.proc.returncode, out

    @classmethod
    def stop(cls) -> None:
        if cls.proc is not None and cls.proc.poll() is None:
            cls.proc.kill()
            cls.proc.communicate()


@pytest.mark.slow
def test_mypy() -> None:
    code, out = Mypy.result()
    assert code == 0, out

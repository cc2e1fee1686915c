"""Lint, format and type checks run with the suite, so the README's one test command covers them."""

from __future__ import annotations

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


@pytest.mark.slow
def test_mypy() -> None:
    res = _run("mypy")
    assert res.returncode == 0, res.stdout + res.stderr

"""Running a benchmark script under scripts/ from a test, with its ``--json`` output checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def run_script(script: str, *args: str, timeout: float = 300) -> list[dict[str, Any]]:
    """The records ``scripts/<script> --json *args`` prints, each checked against the
    convention (``name``, ``value``, ``unit``; ``ratio`` = value / baseline where given)."""
    res = subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--json", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert lines
    for rec in lines:
        assert {"name", "value", "unit"} <= rec.keys(), rec
        if "baseline" in rec:
            assert rec["ratio"] == pytest.approx(rec["value"] / rec["baseline"], rel=1e-2, abs=1e-4)
    return lines

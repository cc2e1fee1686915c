"""scripts/gpu_check.sh: its steps run end to end (``--cpu``), and a machine that lacks dask
and the wheels gets one line that says what to do."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_check_runs_its_steps_and_writes_its_files(tmp_path: Path) -> None:
    out = tmp_path / "check"
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)},
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "every step passed" in res.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "environment.txt", "figures.jsonl", "figures.txt", "pytest.txt",
    ]  # fmt: skip
    assert "deselected" in (out / "pytest.txt").read_text()  # only the gpu tests were chosen
    figures = [json.loads(line) for line in (out / "figures.jsonl").read_text().splitlines()]
    names = " ".join(r["name"] for r in figures)
    for part in ("device lookup hits", "insert+evict", "training pass"):
        assert part in names


def test_missing_packages_without_wheels_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "gpu_check.sh", tmp_path / "scripts")
    bare = tmp_path / "bare-python"  # a Python that sees no site-packages: no dask
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S -I "$@"\n')
    bare.chmod(0o755)
    res = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHON": str(bare)},
    )  # fmt: skip
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1
    assert ".gpu-wheels/" in lines[0] and "scripts/gpu_wheels.sh" in lines[0]

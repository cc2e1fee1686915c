"""``daskhps generate``: writes the logs; errors are one line and a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from daskhps.cli import COMMANDS, main


def test_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        ["generate", "--out", str(tmp_path), "--days", "2", "--rows-per-day", "500", "--gzip"]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "ceiling AUC" in out and "1,000 rows" in out
    assert (tmp_path / "day=2024-01-02" / "_SUCCESS").exists()
    assert len(list(tmp_path.glob("day=*/part-*.tsv.gz"))) == 8


def test_generate_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--out", str(tmp_path), "--rows-per-day", "100", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == 100 and "ceiling_auc" in summary


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--out", str(tmp_path), "--start-day", "yesterday"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("daskhps generate: error: generator:")
    assert "Traceback" not in err
    with pytest.raises(SystemExit) as e:
        main(["generate", "--out", str(tmp_path), "--days", "0"])
    assert e.value.code == 2


def test_drift_and_one_off_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", "--out", str(tmp_path), "--rows-per-day", "200", "--json"]
    assert main([*args, "--drift", "0.2", "--one-off", "0.1"]) == 0
    assert (
        json.loads(capsys.readouterr().out)["config"] | {"drift": 0.2, "one_off": 0.1}
        == (json.loads((tmp_path / "generation.json").read_text())["config"])
    )
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for flag, value in (("--drift", "1.5"), ("--one-off", "-0.1"), ("--one-off", "1")):
        assert main([*args, flag, value]) == 1
        err = capsys.readouterr().err
        key = flag.removeprefix("--").replace("-", "_")
        assert err.count("\n") == 1 and f"generator: {key}: must be" in err, err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_unwritable_output_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["generate", "--out", str(blocker / "sub"), "--rows-per-day", "10"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_installed_entry_point(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "daskhps.cli", "generate", "--out", str(tmp_path),
         "--rows-per-day", "50"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "generate" in COMMANDS

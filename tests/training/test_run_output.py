"""What ``daskhps train`` writes when its output goes to a log file (the real command line in
a subprocess, on a real LocalCluster): no progress bar (a bar redraws its line with carriage
returns, one endless line in a file), none of Dask's INFO lines about its embedded cluster, and
a truncated ``.gz`` file named once, though every pass reads it again."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._runs import cli, tiny_config, write_config

pytestmark = pytest.mark.slow


def _config(tmp_path: Path, name: str, data: dict) -> Path:
    d = tiny_config(tmp_path / name, tmp_path / "logs", run={"quiet": False})
    d["data"] = {**data, "holdout": {"day": "last"}, "bad_rows": "skip"}
    return write_config(tmp_path / f"{name}.yaml", d)


def test_a_log_file_gets_no_bars_and_a_truncated_file_is_named_once(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    generate = {
        "out": str(logs),
        "days": 2,
        "rows_per_day": 1000,
        "parts_per_day": 2,
        "vocab_scale": 0.01,
        "gzip": True,
    }
    first = cli("train", str(_config(tmp_path, "generated", {"generate": generate})))
    assert first.returncode == 0, first.stderr[-3000:]
    for text in (first.stdout, first.stderr):
        assert "\r" not in text and "Completed" not in text and "batch/s" not in text, text
        assert "INFO distributed" not in text, text  # 50 lines a run before they were kept out

    cut = sorted(logs.glob("day=2024-01-01/part-*.tsv.gz"))[0]
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    config = _config(tmp_path, "cut", {"train": {"paths": [str(logs)]}})
    run = cli("train", str(config), "--set", "passes.epochs=2")
    assert run.returncode == 0, run.stderr[-3000:]
    said = [line for line in run.stderr.splitlines() if str(cut) in line]
    assert len(said) == 1, run.stderr
    assert "(truncated_file=1)" in said[0] and "ends early (truncated)" in said[0], said

"""A data path that matches no file is said first and alone: one line naming it, before any
warning about sizing the logs it names, and nothing written (the real command line, in a
subprocess, with a config's defaults: the sizes ``daskhps train`` warns about)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._runs import cli, write_config


@pytest.mark.parametrize("which", ["typo", "empty folder", "glob"])
def test_a_data_path_with_no_file_is_one_line_before_any_warning(
    tmp_path: Path, which: str
) -> None:
    (tmp_path / "data" / "quickstart").mkdir(parents=True)
    path = {
        "typo": tmp_path / "data" / "quickstrat",
        "empty folder": tmp_path / "data" / "quickstart",
        "glob": tmp_path / "data" / "quickstart" / "day=*" / "part-*",
    }[which]
    config = write_config(
        tmp_path / "run.yaml",
        {
            "run": {"name": "typo", "dir": str(tmp_path / "runs" / "typo")},
            "data": {"train": {"paths": [str(path)]}, "holdout": {"day": "last"}},
        },
    )
    res = cli("train", str(config), timeout=120)
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines() == [
        f"daskhps train: error: {config}: data.train: no input files: {path} matched nothing; "
        "check the path, the glob or the day range"
    ]
    assert not (tmp_path / "runs").exists()

"""What the README's main job leaves behind is what the README says, and nothing it writes
shows up in ``git status``."""

from __future__ import annotations

import re
from pathlib import Path

from daskhps.config.checkpoint import CheckpointConfig

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _ignored_top_folders() -> set[str]:
    lines = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    return {m.group(1) for line in lines if (m := re.fullmatch(r"/([\w.-]+)/", line.strip()))}


def test_every_out_folder_of_the_readme_is_git_ignored() -> None:
    outs = set(re.findall(r"--out (\w[\w.-]*)", README))
    assert {"preds", "exported"} <= outs  # the commands this test is about are still there
    assert outs - _ignored_top_folders() == set()


def test_the_readme_says_how_many_checkpoints_are_kept() -> None:
    text = " ".join(README.split())
    keep = CheckpointConfig().keep
    assert f"the newest {keep} checkpoints" in text
    assert "`checkpoint.keep`" in text
    assert "a checkpoint after every pass under" not in text

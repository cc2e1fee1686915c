"""``daskhps config`` and ``daskhps train``: resolved YAML out, errors as one line."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import yaml

from daskhps.cli import COMMANDS, main
from daskhps.config import RunConfig
from tests.config.helpers import MINIMAL, write


def test_commands_registered() -> None:
    assert {"train", "config", "generate"} <= set(COMMANDS)


def test_config_prints_resolved_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, MINIMAL)
    assert main(["config", str(path), "--set", "table.dim=24", "--set", "run.seed=3"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["table"]["dim"] == 24 and out["table"]["seed"] == 3
    assert RunConfig.from_dict(out) == RunConfig.from_dict(
        {"data": {"generate": {}}, "run": {"name": "run"}}, overrides=["table.dim=24", "run.seed=3"]
    )


def test_bad_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, MINIMAL + "table:\n  dim: -1\n")
    for cmd in ("config", "train"):
        assert main([cmd, str(path)]) == 1
        err = capsys.readouterr().err
        assert err == f"daskhps {cmd}: error: {path}:4: table.dim: must be >= 1, got -1\n"


def test_bad_override_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(write(tmp_path, MINIMAL)), "--set", "tabel.dim=3"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean table.dim?" in err


def test_train_without_pipeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "pipelines.train" else real(n, *a)
    )
    assert main(["train", str(write(tmp_path, MINIMAL))]) == 2
    assert "training pipeline not available" in capsys.readouterr().err


def _fake_pipeline(monkeypatch: pytest.MonkeyPatch, run: object) -> None:
    import importlib.util

    module = types.ModuleType("pipelines.train")
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pipelines.train", module)
    real = importlib.util.find_spec
    spec = importlib.util.spec_from_loader("pipelines.train", loader=None)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: spec if n == "pipelines.train" else real(n, *a)
    )


def test_train_calls_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[RunConfig, bool]] = []

    def run(config: RunConfig, resume: bool = False) -> int:
        seen.append((config, resume))
        return 0

    _fake_pipeline(monkeypatch, run)
    path = write(tmp_path, MINIMAL)
    assert main(["train", str(path), "--resume", "--set", "passes.epochs=3"]) == 0
    assert seen[0][1] is True and seen[0][0].passes.epochs == 3


def test_train_resume_needs_support(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_pipeline(monkeypatch, lambda config: None)
    path = write(tmp_path, MINIMAL)
    assert main(["train", str(path)]) == 0
    assert main(["train", str(path), "--resume"]) == 2
    assert "cannot --resume" in capsys.readouterr().err

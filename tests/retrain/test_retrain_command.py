"""``daskhps retrain`` outcomes that need no training: the lock, nothing to do, dry runs, bad
configs and bad versions, each with its exit code and message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from daskhps.cli import main
from daskhps.data.source import SUCCESS
from daskhps.retrain import ExitCode, RetrainLock
from tests._runs import cli, cli_here
from tests.runfiles.test_rundir import tree_digest


def _day(root: Path, day: str, complete: bool = True) -> None:
    folder = root / f"day={day}"
    folder.mkdir(parents=True)
    (folder / "part-00000.tsv").write_text("0\t" + "\t" * 38 + "\n")
    if complete:
        (folder / SUCCESS).write_text("")


def _config(tmp_path: Path, **extra: Any) -> Path:
    d: dict[str, Any] = {
        "run": {"name": "rt", "dir": str(tmp_path / "run"), "quiet": True},
        "data": {"train": {"paths": [str(tmp_path / "logs")]}},
        **extra,
    }
    path = tmp_path / "retrain.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def test_locked_run_exits_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _day(tmp_path / "logs", "2024-01-01")
    _day(tmp_path / "logs", "2024-01-02")
    cfg = _config(tmp_path)
    with RetrainLock(tmp_path / "run"):
        assert main(["retrain", str(cfg)]) == ExitCode.LOCKED == 5
        assert main(["retrain", str(cfg), "--rollback", "v000001"]) == ExitCode.LOCKED
    err = capsys.readouterr().err
    assert "locked: another retraining run holds" in err and "retrain.lock" in err
    assert (
        not (tmp_path / "run" / "versions").exists()
        and not (tmp_path / "run" / "attempts").exists()
    )


def test_nothing_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    cfg = _config(tmp_path)
    assert main(["retrain", str(cfg)]) == ExitCode.NOTHING_NEW == 3
    assert "nothing to do: no complete day on disk" in capsys.readouterr().out
    _day(logs, "2024-01-01")
    _day(logs, "2024-01-02", complete=False)
    assert main(["retrain", str(cfg)]) == ExitCode.NOTHING_NEW
    out = capsys.readouterr().out
    assert "only one complete day" in out and "ignored: 2024-01-02" in out
    assert not (tmp_path / "run" / "attempts").exists()  # nothing was trained


def test_dry_run_names_the_days(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for day in ("2024-01-01", "2024-01-02", "2024-01-03"):
        _day(tmp_path / "logs", day)
    _day(tmp_path / "logs", "2024-01-04", complete=False)
    assert main(["retrain", str(_config(tmp_path)), "--dry-run"]) == ExitCode.PUBLISHED
    out = capsys.readouterr().out
    assert "would train on 2024-01-01, 2024-01-02 from scratch" in out
    assert "score on 2024-01-03; ignored: 2024-01-04" in out
    assert not (tmp_path / "run" / "attempts").exists()


def test_rollback_to_an_unknown_version_is_a_bad_argument(tmp_path: Path) -> None:
    """Exit 2, as every other bad argument: a cron job's wrapper tells a typo from a failure."""
    (tmp_path / "logs").mkdir()
    res = cli("retrain", str(_config(tmp_path)), "--rollback", "v000003", timeout=120)
    assert res.returncode == ExitCode.BAD_CONFIG == 2, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert "no version 'v000003'" in lines[0] and "published versions: none" in lines[0]


def test_versions_listing_when_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["retrain", str(_config(tmp_path)), "--versions"]) == ExitCode.PUBLISHED
    assert "(none published)" in capsys.readouterr().out


def test_dry_run_of_generated_logs_names_their_days_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "gen.yaml"
    out = tmp_path / "gen"
    d = {"run": {"dir": str(tmp_path / "run")}, "data": {"generate": {"out": str(out), "days": 3}}}
    cfg.write_text(yaml.safe_dump(d))
    assert main(["retrain", str(cfg), "--dry-run"]) == ExitCode.PUBLISHED
    said = capsys.readouterr().out
    assert "would train on 2024-01-01, 2024-01-02 from scratch" in said
    assert "score on 2024-01-03" in said and not out.exists()


def test_missing_log_folder_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["retrain", str(_config(tmp_path))]) == ExitCode.ERROR
    assert "does not exist; check data.train.paths" in capsys.readouterr().err


def test_bad_config_is_one_line_without_traceback(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config(tmp_path, retrain={"max_auc_drop": -1})
    res = cli_here(capfd, caplog, "retrain", str(cfg))  # every logged line in its stderr too
    assert res.returncode == ExitCode.BAD_CONFIG
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "retrain.max_auc_drop: must be >= 0.0" in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_help_lists_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["retrain", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for code in ExitCode:
        assert f"\n  {int(code)}  " in out


def test_damaged_registry_stops_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _day(tmp_path / "logs", "2024-01-01")
    _day(tmp_path / "logs", "2024-01-02")
    registry = tmp_path / "run" / "versions" / "registry.json"
    registry.parent.mkdir(parents=True)
    registry.write_text('{"format": 1, "versions": [')
    assert main(["retrain", str(_config(tmp_path))]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert "registry.json is unreadable" in err and "restore it from a backup" in err
    assert registry.read_text() == '{"format": 1, "versions": ['  # left as it was
    assert not (tmp_path / "run" / "attempts").exists()


def test_a_training_run_is_refused_and_left_as_it_was(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """``retrain`` pointed at a folder that ``train`` made: one line naming ``train
    --resume``, exit 2, before any day is generated or any attempt recorded."""
    run = tmp_path / "run"
    (run / "checkpoints" / "pass-000001").mkdir(parents=True)
    (run / "checkpoints" / "pass-000001" / "MANIFEST.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"pass": 1}\n')
    cfg = tmp_path / "train.yaml"  # a training config: generated logs, no retrain section
    cfg.write_text(
        yaml.safe_dump(
            {
                "run": {"name": "rt", "dir": str(run), "quiet": True},
                "data": {"generate": {"out": str(tmp_path / "gen"), "days": 2}},
            }
        )
    )
    before = tree_digest(tmp_path)
    done = cli_here(capfd, caplog, "retrain", str(cfg))
    assert done.returncode == ExitCode.BAD_CONFIG == 2
    line = done.stderr.strip().splitlines()[-1]
    assert "holds a training run" in line and "daskhps train" in line and "--resume" in line
    assert tree_digest(tmp_path) == before
    assert not (tmp_path / "gen").exists()

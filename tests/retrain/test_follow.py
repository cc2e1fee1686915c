"""``daskhps retrain --follow`` end to end: real generated chunks renamed into a watched folder,
real training on the follower's own LocalCluster (a subprocess, as a user runs it), real zarr
stores, the command line's exit codes.

- Exactly once under SIGKILL: a follower is killed while listing, reading (staging), training,
  checkpointing and publishing, started again each time, and the versions it publishes equal,
  bit for bit, those of a follower that was never interrupted, chunk for chunk; each chunk's
  files are recorded in exactly one published attempt.
- SIGTERM while a chunk is in hand finishes and publishes it, then exits 0; a second follower
  of the same run folder is refused in one line; a chunk with no good row is skipped in one
  line and the follower goes on; each version is scored on its chunk before training on it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daskhps.retrain import ExitCode, Registry
from daskhps.runfiles.checkpoint import load_checkpoint
from tests._hosts import same_model, stored_model
from tests._logs import generated_logs
from tests._runs import cli, cli_here, tiny_config, write_config
from tests._signals import default_dispositions
from tests.runfiles.test_rundir import tree_digest

pytestmark = pytest.mark.slow

ROWS = 400  # per chunk: one pass each


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    logs = generated_logs(
        tmp_path_factory, days=1, rows_per_day=ROWS * 5, parts_per_day=5, seed=3, name="chunks"
    )
    return sorted((logs / "day=2024-01-01").glob("part-*"))


def _follower(tmp: Path, name: str) -> tuple[Path, Path]:
    """A follower's config over an empty watched folder: (config, watched folder)."""
    watched = tmp / f"{name}-logs"
    watched.mkdir()
    cfg = tiny_config(
        tmp / name,
        watched,
        passes={"examples_per_pass": ROWS, "global_batch_size": 100},
        eval={"every_pass": False},
        retrain={"poll_seconds": 0.2},
    )
    return write_config(tmp / f"{name}.yaml", cfg), watched


def _land(parts: list[Path], watched: Path, n: int | None = None) -> None:
    """Copy parts into ``watched`` as a writer would: beside it under a hidden name, then
    renamed into place."""
    for p in parts[:n]:
        shutil.copyfile(p, watched / f".{p.name}.tmp")
        os.rename(watched / f".{p.name}.tmp", watched / p.name)


def _same(a: str, b: str) -> bool:
    """Two versions' models, bit for bit."""
    return same_model(stored_model(load_checkpoint(a)), stored_model(load_checkpoint(b)))


def _versions(run: Path) -> list[tuple[str, str, str]]:
    """(version, its chunk's file name, its checkpoint) of every published version."""
    return [
        (v.name, Path(v.chunk or "").name, v.checkpoint)
        for v in Registry(run / "versions").versions()
    ]


def test_a_killed_follower_trains_every_chunk_exactly_once(
    parts: list[Path], tmp_path: Path
) -> None:
    chunks = parts[:3]
    ref_cfg, ref_logs = _follower(tmp_path, "uninterrupted")
    _land(chunks, ref_logs)
    done = cli("retrain", str(ref_cfg), "--follow", "--max-chunks", "3")
    assert done.returncode == 0, done.stderr
    ref = _versions(tmp_path / "uninterrupted")
    assert [(v, c) for v, c, _ in ref] == [
        ("v000001", chunks[0].name),
        ("v000002", chunks[1].name),
        ("v000003", chunks[2].name),
    ]

    cfg, logs = _follower(tmp_path, "killed")
    _land(chunks, logs)
    run = tmp_path / "killed"
    registry = Registry(run / "versions")
    # while listing, reading, training, checkpointing and publishing the first chunk, then
    # just after its publish
    for point, published in (
        ("follow_listed", 0),
        ("stage", 0),
        ("mid_pass", 0),
        ("checkpoint_commit", 0),
        ("publish_frozen", 0),
        ("published", 1),
    ):
        killed = cli("retrain", str(cfg), "--follow", "--max-chunks", "3", kill_at=point)
        assert killed.returncode == -signal.SIGKILL, (point, killed.stderr)
        assert len(registry.versions()) == published, point
    assert [Path(v.chunk or "").name for v in registry.versions()] == [chunks[0].name]
    rest = cli("retrain", str(cfg), "--follow", "--max-chunks", "2")
    assert rest.returncode == 0, rest.stderr
    assert "stopped after 2 chunks; v000003 is current" in rest.stdout

    got = _versions(run)
    assert [(v, c) for v, c, _ in got] == [(v, c) for v, c, _ in ref]
    for (name, _, a), (_, _, b) in zip(got, ref, strict=True):
        assert _same(a, b), f"{name} differs from the uninterrupted follower's"
    # exactly once: each file in one published attempt, no attempt but published ones
    attempts = registry.attempts()
    assert [a.outcome for a in attempts] == ["published"] * 3
    files = [f for a in attempts for f in a.files]
    assert sorted(files) == sorted(str(logs / c.name) for c in chunks)
    # progressive validation: each version's baseline is its parent scored on its chunk,
    # before training on it; the first's is the untrained model
    for v in registry.versions():
        assert v.baseline["examples"] == v.metrics["examples"] == ROWS
        assert v.baseline["logloss"] != v.metrics["logloss"]
    status = json.loads((run / "follow.json").read_text())
    assert status["trained"] == 2 and status["waiting"] == 0 and status["published"] == "v000003"


def test_sigterm_finishes_the_chunk_in_hand_and_a_second_follower_is_refused(
    parts: list[Path],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg, logs = _follower(tmp_path, "run")
    run = tmp_path / "run"
    (logs / parts[0].name).write_text("not\ta\tclick\tlog\n")  # no good row: skipped
    env = {k: v for k, v in os.environ.items() if k != "DASKHPS_KILL_AT"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "daskhps.cli", "retrain", str(cfg), "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=default_dispositions,
    )
    try:
        registry = Registry(run / "versions")
        deadline = time.monotonic() + 300
        while not registry.attempts():  # the bad chunk was looked at and skipped
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        # the folder is followed: a second follower (or a scheduled run) is refused
        second = cli_here(capfd, caplog, "retrain", str(cfg), "--follow")
        assert second.returncode == ExitCode.LOCKED
        assert "locked: another retraining run holds" in second.stderr
        _land(parts[1:2], logs)
        attempts = run / "attempts"
        while not any(attempts.iterdir()):  # the good chunk is in hand (the skipped one's
            # folder was removed with it)
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = out or ""
    assert proc.returncode == 0, err
    assert "SIGTERM: finishing the chunk in hand, then stopping" in err
    assert f"{parts[0].name}: skipped, nothing trained" in err
    assert "follow: published v000001, trained on" in err and "stopped after 2 chunks" in out
    skipped, published = registry.attempts()
    assert skipped.outcome == "rejected" and "no good row" in skipped.reasons[0]
    assert published.outcome == "published" and published.chunk == str(logs / parts[1].name)
    # which chunk each version trained on, and the skipped one with why
    listed = cli_here(capfd, caplog, "retrain", str(cfg), "--versions")
    assert listed.returncode == 0
    assert f"*  v000001  -       {parts[1].name}  its chunk, first" in listed.stdout
    assert f"rejected on {parts[0].name}: its data:" in listed.stdout
    inspected = cli_here(capfd, caplog, "inspect", str(run))
    assert inspected.returncode == 0, inspected.stderr
    assert parts[1].name in inspected.stdout and "current version v000001:" in inspected.stdout


def _fill(folder: Path, leave: int) -> Path:
    """A file that takes all of ``folder``'s disk but ``leave`` bytes."""
    st = os.statvfs(folder)
    filler = folder / "filler"
    with open(filler, "wb") as f:
        f.truncate(0)
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler


def test_a_full_disk_stops_the_follower_and_publishes_nothing_half(
    parts: list[Path], tmp_path: Path
) -> None:
    """The run folder on a small disk of its own (a tmpfs) that fills up while a chunk is
    trained: the follower stops in one line with exit 1, the published version stays current
    and unchanged, no half version is left; with room again, the next follower trains that
    chunk."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a disk of its own needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], check=False
    )
    if mounted.returncode != 0:
        pytest.skip("this machine cannot mount a tmpfs")
    try:
        watched = tmp_path / "logs"
        watched.mkdir()
        cfg = write_config(
            tmp_path / "follow.yaml",
            tiny_config(
                disk / "run",
                watched,
                passes={"examples_per_pass": ROWS, "global_batch_size": 100},
                eval={"every_pass": False},
            ),
        )
        _land(parts[:1], watched)
        assert cli("retrain", str(cfg), "--follow", "--max-chunks", "1").returncode == 0
        registry = Registry(disk / "run" / "versions")
        v1 = disk / "run" / "versions" / "v000001"
        before = tree_digest(v1)
        filler = _fill(disk, leave=16 << 10)
        _land(parts[1:2], watched)
        full = cli("retrain", str(cfg), "--follow", "--max-chunks", "1")
        assert full.returncode == 1, full.stderr
        # the follower's one line (a worker's task that failed is logged above it by Dask)
        said = full.stderr.splitlines()[-1]
        assert said.startswith("daskhps retrain: error: a disk filled up while training"), said
        assert "nothing of it was published, v000001 stays current; free space" in said
        assert [v.name for v in registry.versions()] == ["v000001"]
        assert registry.current() is not None and registry.current().name == "v000001"
        assert not (disk / "run" / "versions" / "v000002").exists()
        assert tree_digest(v1) == before
        assert registry.attempts()[-1].outcome == "failed"
        filler.unlink()
        again = cli("retrain", str(cfg), "--follow", "--max-chunks", "1")
        assert again.returncode == 0, again.stderr
        v2 = registry.current()
        assert v2 is not None and v2.name == "v000002" and v2.chunk == str(watched / parts[1].name)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)

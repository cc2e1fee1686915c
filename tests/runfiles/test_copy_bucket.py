"""A run's copy in object storage never creates its bucket (issue 43): the bucket of
``checkpoint.replicate_to`` is the user's to create, so one that does not exist is refused in
one line before the run starts, and a bucket deleted under a running copy stays deleted.
An S3-compatible server on 127.0.0.1 (tests/_s3.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from daskhps import storage
from daskhps.runfiles.replica import Replica, mirror_store
from tests._logs import generated_logs
from tests._runs import cli_here, config_checkpoint, tiny_config, write_config
from tests._s3 import KEY, SECRET, s3_server


def test_a_copy_in_a_bucket_that_does_not_exist_is_refused_and_never_created(
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    logs = generated_logs(tmp_path_factory, days=2, rows_per_day=200, parts_per_day=1, seed=3)
    with s3_server() as server:
        config = tiny_config(
            tmp_path / "run",
            logs,
            checkpoint={"replicate_to": "s3://no-such-copies/run"},
            storage={"options": server.options},
        )
        cfg = write_config(tmp_path / "run.yaml", config)
        try:
            got = cli_here(capfd, caplog, "train", str(cfg))
        finally:
            storage.use_options({"s3": {}})
        assert got.returncode == 1, got.stderr
        errors = [line for line in got.stderr.splitlines() if "error" in line]
        assert errors == [
            f"daskhps train: error: {cfg}: checkpoint.replicate_to: the bucket 'no-such-copies' "
            "of s3://no-such-copies/run does not exist: create it, or set "
            "checkpoint.replicate_to to a bucket that exists (daskhps creates no bucket)"
        ], got.stderr
        assert "Traceback" not in got.stderr
        assert KEY not in got.stderr and SECRET not in got.stderr
        assert not server.fs().exists("no-such-copies")
        assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_copy_whose_bucket_was_deleted_fails_and_leaves_it_deleted(tmp_path: Path) -> None:
    """Each way the copy writes (a store's files, a checkpoint's manifest) fails in a bucket
    gone since the run started, rather than creating it again."""
    local = tmp_path / "rank-0"
    for rel in ("segments/0000000001/rows", "commits/0000000001", "zarr.json"):
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(b"x" * 10)
    with s3_server() as server:
        storage.use_options(server.options)
        try:
            replica = Replica(server.bucket("copies") + "/run")
            replica.check_writable("run.yaml")
            dest = replica.store_path("stores", "emb", 0)
            assert mirror_store(replica.fs, local, dest).files == 3
            assert sorted(p.rsplit("/", 1)[-1] for p in server.fs().find(dest)) == [
                "0000000001",
                "rows",
                "zarr.json",
            ]
            server.fs().rm("copies", recursive=True)
            assert not server.fs().exists("copies")
            replica.fs.invalidate_cache()
            (local / "commits" / "0000000002").write_bytes(b"y")
            with pytest.raises(FileNotFoundError, match="bucket"):
                mirror_store(replica.fs, local, dest)
            ckpt = config_checkpoint(tmp_path / "checkpoints" / "pass-000001", {})
            with pytest.raises(FileNotFoundError, match="bucket"):
                replica.put_checkpoint(ckpt)
            assert not server.fs().exists("copies")
        finally:
            storage.use_options({"s3": {}})

"""Click logs read from object storage: an S3-compatible server on 127.0.0.1 (tests/_s3.py),
reached over HTTP through s3fs, against the same files read from a local folder.

One folder holds every kind of input the readers take (day folders with and without
``_SUCCESS``, ``.gz``, plain text read in byte blocks, parquet, bad rows, a line that is not
UTF-8, a truncated ``.gz``); it is uploaded once and read both ways: the rows, the keys and the
bad-row report are the same. Then each failure of the store is one line naming the URL.
"""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dask
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from daskhps import storage
from daskhps.data import BadRowPolicy, Schema, read_click_log, resolve_files
from daskhps.data.badrows import BadRowReport
from daskhps.errors import DataError, StorageError
from daskhps.retrain.days import scan_days
from tests._s3 import KEY, SECRET, S3Server, s3_server
from tests.data.test_readers import SCHEMA

GOOD = [f"{i % 2}\t{i}\t{i * 3}\tk{i % 97:x}\tv{i % 13}" for i in range(4000)]
BAD = ["1\t2\t3", "2\t1\t1\tx\ty", "1\tabc\t2\tx\ty", ""]


def _text(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def _logs(root: Path) -> Path:
    """Every kind of input: three days (the last without _SUCCESS), gz and plain parts with
    bad rows, one not UTF-8, a truncated gz, a plain part larger than the block size."""
    d1, d2, d3 = (root / f"day=2024-01-0{i}" for i in (1, 2, 3))
    for d in (d1, d2, d3):
        d.mkdir(parents=True)
    (d1 / "part-00000.tsv.gz").write_bytes(gzip.compress(_text(GOOD[:1000] + BAD)))
    (d1 / "part-00001.tsv").write_bytes(_text(GOOD[1000:3000]) + b"0\t1\t1\t\xff\xfe\ty\n")
    (d1 / "_SUCCESS").write_bytes(b"")
    whole = gzip.compress(_text(GOOD[3000:3500]))
    (d2 / "part-00000.tsv.gz").write_bytes(whole[: len(whole) * 2 // 3])  # truncated
    (d2 / "part-00001.tsv").write_bytes(_text(GOOD[3500:]))
    (d2 / "_SUCCESS").write_bytes(b"")
    (d3 / "part-00000.tsv").write_bytes(_text(GOOD[:10]))  # being written: no marker
    return root


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with s3_server() as s:
        storage.use_options(s.options)
        yield s
        storage.use_options({"s3": {}})


@pytest.fixture(scope="module")
def logs(server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    local = _logs(tmp_path_factory.mktemp("object-logs"))
    return local, server.upload(local, server.bucket("clicks") + "/logs")


def _read(paths: str | list[str], **kw: object) -> tuple[pd.DataFrame, BadRowReport, tuple]:
    log = read_click_log(paths, schema=SCHEMA, bad_rows=BadRowPolicy(), **kw)  # type: ignore[arg-type]
    with dask.config.set(scheduler="sync"):
        frame, report = dask.compute(log.frame, log.report)
    return frame.reset_index(drop=True), BadRowReport.from_frame(report), log.part_names


def _relative(names: object, base: str) -> list[str]:
    return [str(n).replace(base, "<logs>") for n in names]  # type: ignore[attr-defined]


@pytest.mark.parametrize("block_size", [None, 8 << 10])
def test_the_same_logs_read_from_the_server_and_from_disk_give_the_same_rows(
    logs: tuple[Path, str], block_size: int | None
) -> None:
    local, url = logs
    want, want_report, want_parts = _read(str(local), block_size=block_size)
    got, got_report, got_parts = _read(url, block_size=block_size)
    assert len(got) == len(want) > 3500
    pd.testing.assert_frame_equal(got, want)  # labels, dense values and hashed keys
    assert _relative(got_parts, url) == _relative(want_parts, str(local))
    assert len(got_parts) > 5 if block_size else len(got_parts) == 5
    assert got_report.by_reason() == want_report.by_reason()
    assert set(got_report.by_reason()) >= {"undecodable", "truncated_file", "label_invalid"}
    rename = {k.replace(url, str(local)): v for k, v in got_report.by_shard().items()}
    assert rename == want_report.by_shard()


def test_parquet_objects_read_like_parquet_files(server: S3Server, tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {c: [line.split("\t")[i] for line in GOOD[:500]] for i, c in enumerate(SCHEMA.columns)}
    )
    (tmp_path / "p").mkdir()
    pq.write_table(pa.Table.from_pandas(frame), tmp_path / "p" / "part-0.parquet")
    url = server.upload(tmp_path / "p", server.bucket("parquet-logs") + "/p")
    schema = Schema.from_dict({**SCHEMA.to_dict(), "format": "parquet"})
    want = read_click_log(str(tmp_path / "p"), schema=schema).frame.compute(scheduler="sync")
    got = read_click_log(url, schema=schema).frame.compute(scheduler="sync")
    assert len(got) == 500
    pd.testing.assert_frame_equal(got, want)


def test_listing_keeps_days_markers_and_globs(logs: tuple[Path, str]) -> None:
    local, url = logs
    rel = lambda files, base: [f.replace(base, "") for f in files]  # noqa: E731
    for args in ((), (("2024-01-02", "2024-01-03"),)):
        assert rel(resolve_files(url, *args), url) == rel(
            resolve_files(str(local), *args), str(local)
        )
    complete = resolve_files(url, require_complete=True)
    assert complete == resolve_files(f"{url}/day=*/part-*", require_complete=True)
    assert {f.split("/")[-2] for f in complete} == {"day=2024-01-01", "day=2024-01-02"}
    assert all(f.startswith("s3://clicks/logs/day=") for f in complete)
    days = scan_days(url)
    assert [(d.day, d.complete, len(d.files)) for d in days] == [
        ("2024-01-01", True, 2),
        ("2024-01-02", True, 2),
        ("2024-01-03", False, 1),
    ]
    with pytest.raises(DataError, match=r"s3://clicks/logs/day=2024-01-03 matched nothing in "):
        resolve_files(f"{url}/day=2024-01-03", require_complete=True)


def _one_line(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(excinfo.value)
    assert "\n" not in text and SECRET not in text and KEY not in text
    return text


def test_a_bucket_that_does_not_exist_is_named(server: S3Server) -> None:
    for bad in ("s3://no-such-bucket/logs", "s3://no-such-bucket/logs/day=*/part-*"):
        with pytest.raises(StorageError) as e:
            resolve_files(bad)
        assert _one_line(e).startswith(f"{bad}: the bucket 'no-such-bucket' does not exist")


def test_an_endpoint_that_refuses_connections_is_named(server: S3Server) -> None:
    opts = server.options["s3"]
    storage.use_options({"s3": {**opts, "endpoint_url": "http://127.0.0.1:9"}})
    try:
        with pytest.raises(StorageError) as e:
            resolve_files("s3://clicks/logs")
    finally:
        storage.use_options(server.options)
    assert _one_line(e).startswith(
        "s3://clicks/logs: cannot connect to the store's endpoint http://127.0.0.1:9: "
    )


def test_wrong_credentials_are_access_denied_never_printed(server: S3Server) -> None:
    with s3_server(auth=True) as strict:
        storage.use_options(strict.options)
        try:
            with pytest.raises(StorageError) as e:
                resolve_files("s3://clicks/logs")
        finally:
            storage.use_options(server.options)
    line = _one_line(e)
    assert line.startswith("s3://clicks/logs: access denied (")
    assert "check the credentials in storage.options" in line


def test_a_protocol_whose_package_is_missing_names_the_package() -> None:
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401

        pytest.skip("gcsfs is installed here")
    except ImportError:
        pass
    with pytest.raises(StorageError) as e:
        resolve_files("gs://logs/day=*/")
    assert _one_line(e) == (
        "gs://logs/day=*/: reading gs:// URLs needs the gcsfs package, which is not "
        "installed: pip install 'daskhps[gcs]' (or pip install gcsfs)"
    )


def test_credentials_in_a_url_are_never_shown() -> None:
    assert storage.shown("s3://AKIA:hunter2@bucket/x?X-Amz-Signature=abc") == "s3://bucket/x"
    assert storage.shown("/local/a?b") == "/local/a?b"


def test_an_object_deleted_between_listing_and_reading_is_one_line(
    server: S3Server, tmp_path: Path
) -> None:
    (tmp_path / "l" / "day=2024-01-01").mkdir(parents=True)
    for i in range(2):
        (tmp_path / "l" / "day=2024-01-01" / f"part-{i}.tsv").write_bytes(_text(GOOD[:50]))
    url = server.upload(tmp_path / "l", server.bucket("vanishing") + "/l")
    log = read_click_log(url, schema=SCHEMA)  # listed and planned
    gone = f"{url}/day=2024-01-01/part-1.tsv"
    server.fs().rm_file(gone.split("://", 1)[1])
    storage.filesystem(url)[0].invalidate_cache()
    with pytest.raises(StorageError) as e:
        log.frame.compute(scheduler="sync")  # under skip too: not a bad row
    assert _one_line(e).startswith(f"{gone}: the object is gone: it was listed when the run")


def test_the_quickstart_generates_its_days_into_a_bucket(server: S3Server) -> None:
    from daskhps.cli import main

    url = server.bucket("generated") + "/logs"
    args = [
        "generate",
        "--out",
        url,
        "--days",
        "2",
        "--rows-per-day",
        "300",
        "--parts-per-day",
        "2",
    ]
    assert main([*args, "--vocab-scale", "0.01"]) == 0
    fs = server.fs()
    names = sorted(p.split("/logs/", 1)[1] for p in fs.find("generated/logs"))
    assert names == [
        "day=2024-01-01/_SUCCESS",
        "day=2024-01-01/part-00000.tsv",
        "day=2024-01-01/part-00001.tsv",
        "day=2024-01-02/_SUCCESS",
        "day=2024-01-02/part-00000.tsv",
        "day=2024-01-02/part-00001.tsv",
        "generation.json",
    ]
    assert len(read_click_log(url).frame.compute(scheduler="sync")) == 600
    assert not any(n.endswith((".tmp", ".part")) for n in os.listdir("."))


@contextmanager
def _no_credentials(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process reaches the server with no credentials anywhere botocore looks."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance to ask
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    storage.use_options(
        {"s3": {k: v for k, v in server.options["s3"].items() if k not in ("key", "secret")}}
    )
    try:
        yield
    finally:
        storage.use_options(server.options)


def test_no_credentials_is_one_line_when_reading_and_before_writing_a_copy(
    server: S3Server, logs: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore's "no credentials" is no OSError: a worker without them reading the logs the
    driver listed, and checkpoint.replicate_to's probe before a run, say so in one line."""
    from daskhps.errors import ConfigError
    from daskhps.runfiles.replica import Replica

    _, url = logs
    log = read_click_log(url, schema=SCHEMA)  # planned where the credentials are
    copy = server.bucket("no-credentials") + "/run"
    with _no_credentials(server, monkeypatch):
        with pytest.raises(StorageError) as e:
            log.frame.compute(scheduler="sync")
        assert re.match(
            rf"{re.escape(url)}/day=2024-01-0[123]/part-0000[01]\.tsv(\.gz)?: "
            r"no credentials were found: give them in storage\.options",
            _one_line(e),
        )
        with pytest.raises(ConfigError) as c:
            Replica(copy).check_writable("run.yaml")
    assert _one_line(c) == (
        f"run.yaml: checkpoint.replicate_to: cannot write checkpoints to {copy} (no credentials "
        "were found: give them in storage.options, the environment (AWS_ACCESS_KEY_ID, ...) or "
        "the package's config file); set it to a writable folder or URL, or remove it"
    )

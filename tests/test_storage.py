"""daskhps.storage: URLs against plain paths, what is shown of a URL, and how storage options
join fsspec's own config (a worker of a long-lived cluster takes each run's options, and none
of an earlier run's)."""

from __future__ import annotations

from collections.abc import Iterator

import fsspec
import pytest

from daskhps import storage


@pytest.fixture
def conf() -> Iterator[dict]:
    """fsspec's config, restored after the test."""
    saved = {k: dict(v) for k, v in fsspec.config.conf.items()}
    storage._SET.clear()
    yield fsspec.config.conf
    fsspec.config.conf.clear()
    fsspec.config.conf.update(saved)
    storage._SET.clear()


def test_urls_and_paths() -> None:
    assert [storage.is_url(p) for p in ("s3://b/k", "gs://b", "file:///x", "/x", "x/y", "C:x")] == [
        True, True, False, False, False, False,
    ]  # fmt: skip
    assert storage.local_path("file:///data/logs") == "/data/logs"
    assert storage.bucket_of("s3://clicks/logs/day=1") == "clicks"
    assert storage.bucket_of("hdfs://nn:8020/logs") is None
    assert storage.folder_of("s3://b/logs/part-0.tsv") == "s3://b/logs"
    assert storage.shown("abfs://acct:key@container/x?sig=1") == "abfs://container/x"


def test_options_join_fsspec_config_and_replace_restores_what_was_there(conf: dict) -> None:
    conf["ftp"] = {"timeout": 1}  # from fsspec's environment variables or files
    storage.use_options({"ftp": {"timeout": 2}, "sftp": {"port": 2222}})
    assert conf["ftp"] == {"timeout": 2} and conf["sftp"] == {"port": 2222}
    storage.use_options({"ftp": {"timeout": 3}})  # additive: sftp stays
    assert conf["sftp"] == {"port": 2222}
    storage.use_options({}, replace=True)  # the next run names none: what was there before
    assert conf["ftp"] == {"timeout": 1} and "sftp" not in conf
    storage.use_options({}, replace=True)  # nothing of ours left: nothing changes
    assert conf["ftp"] == {"timeout": 1}


def test_failures_are_named_in_words_of_the_fix() -> None:
    cases = {
        FileNotFoundError("The specified bucket does not exist"): "the bucket 'b' does not exist",
        PermissionError("Forbidden"): "access denied (Forbidden): check the credentials",
        ConnectionRefusedError("nope"): "cannot connect to the store's endpoint",
        FileNotFoundError("x"): "the object is gone: it was listed when the run was planned",
    }
    for exc, said in cases.items():
        line = str(storage.failure("s3://b/k", exc, "read"))
        assert line.startswith("s3://b/k: ") and said in line and "\n" not in line, line

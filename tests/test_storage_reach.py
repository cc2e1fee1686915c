"""A store that refuses connections is said within seconds (issue 43): botocore's own retries
(5 attempts, backoff growing to 15 s) once kept a run silent 25 to 33 s before its one line.
daskhps sets s3's retries only where the user set none: in ``storage.options``, fsspec's
config, or botocore's own variables and config file. An S3-compatible server on 127.0.0.1
(tests/_s3.py) shows that the defaults still reach a store that answers."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from daskhps import storage
from daskhps.data import resolve_files
from daskhps.errors import ConfigError, StorageError
from daskhps.runfiles.replica import Replica
from tests._runs import cli_here, tiny_config, write_config
from tests._s3 import KEY, SECRET, s3_server

# A refused connection fails at once: only retries and their backoff take time, so the bound
# holds on a loaded machine too.
BOUND_S = 5.0


@pytest.fixture(autouse=True)
def no_retry_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No retries set anywhere botocore looks; fsspec's config restored after."""
    for name in ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    saved = {k: dict(v) for k, v in fsspec.config.conf.items()}
    yield
    storage.use_options({}, replace=True)
    fsspec.config.conf.clear()
    fsspec.config.conf.update(saved)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _refused() -> dict[str, str]:
    return {"endpoint_url": f"http://127.0.0.1:{_closed_port()}", "key": KEY, "secret": SECRET}


def test_a_refused_endpoint_is_one_line_within_seconds(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    options = _refused()
    storage.use_options({"s3": options})
    for doing in (
        lambda: resolve_files("s3://clicks/logs"),
        lambda: Replica("s3://copies/run").check_writable("run.yaml"),
    ):
        start = time.monotonic()
        with pytest.raises((StorageError, ConfigError), match="cannot connect to the store's"):
            doing()
        assert time.monotonic() - start < BOUND_S
    config = tiny_config(
        tmp_path / "run",
        tmp_path,
        data={"train": {"paths": ["s3://clicks/logs"]}},
        checkpoint={"replicate_to": "s3://copies/run"},
        storage={"options": {"s3": options}},
    )
    cfg = write_config(tmp_path / "run.yaml", config)
    import pipelines.train  # noqa: F401  # the imports of a first run: not the store's time

    start = time.monotonic()
    got = cli_here(capfd, caplog, "train", str(cfg))
    took = time.monotonic() - start
    assert got.returncode == 1, got.stderr
    (line,) = [x for x in got.stderr.splitlines() if "error" in x]
    assert "checkpoint.replicate_to: cannot write checkpoints to s3://copies/run (cannot " in line
    assert took < BOUND_S, (took, got.stderr)


def test_the_users_own_retries_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    def config_kwargs() -> dict:
        fs, _ = storage.filesystem("s3://b/k")
        return dict(fs.config_kwargs)  # type: ignore[attr-defined]

    storage.use_options({"s3": {"config_kwargs": {"connect_timeout": 3}}})
    assert config_kwargs() == {
        "connect_timeout": 3,
        "retries": {"total_max_attempts": 2, "mode": "standard"},
    }
    mine = {"connect_timeout": 3, "retries": {"max_attempts": 9}}
    storage.use_options({"s3": {"config_kwargs": mine}})
    assert config_kwargs() == mine
    storage.use_options({"s3": {}})
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "7")
    assert config_kwargs() == {}


def test_the_defaults_reach_a_store_that_answers() -> None:
    with s3_server() as server:
        url = server.bucket("clicks") + "/logs"
        server.fs().pipe(f"{url[5:]}/day=2024-01-01/part-0.tsv", b"1\t2\n")
        storage.use_options({"s3": {"endpoint_url": server.endpoint, "key": KEY, "secret": SECRET}})
        assert resolve_files(url) == [f"{url}/day=2024-01-01/part-0.tsv"]
        Replica(server.bucket("copies") + "/run").check_writable("run.yaml")

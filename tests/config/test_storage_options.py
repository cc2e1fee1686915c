"""``storage.options`` names only options the protocol's filesystem takes (issue 43): a
misspelt or unknown one is one line when the config is read (the file, the line, the dotted
key, the option meant and the ones allowed), not a traceback from the package at the first
request. What s3fs takes is what it hands on too (aiobotocore's session, fsspec's caches),
and a protocol whose package is not installed is left to the URL that uses it."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from daskhps import storage
from daskhps.data import resolve_files
from tests._runs import cli_here, tiny_config, write_config
from tests._s3 import KEY, SECRET, s3_server
from tests.config.helpers import MINIMAL, error, load, located


@pytest.fixture(autouse=True)
def conf() -> Iterator[None]:
    """fsspec's config, which reading a config changes, restored after each test."""
    saved = {k: dict(v) for k, v in fsspec.config.conf.items()}
    yield
    storage.use_options({}, replace=True)
    fsspec.config.conf.clear()
    fsspec.config.conf.update(saved)


def _s3(options: str) -> str:
    return MINIMAL + f"storage:\n  options:\n    s3:\n{options}"


def test_an_unknown_option_is_one_line_naming_the_key_and_what_is_allowed(
    tmp_path: Path,
) -> None:
    msg = error(tmp_path, _s3("      endpoint_url: http://x\n      bogus_opt: 1\n"))
    assert located(msg, tmp_path / "run.yaml", "storage.options.s3.bogus_opt", 7), msg
    assert "unknown option of the s3:// filesystem; allowed options: anon, " in msg, msg
    assert "endpoint_url" in msg and "profile" in msg and "\n" not in msg
    msg = error(tmp_path, _s3("      endpoint_ulr: http://x\n"))
    assert located(msg, tmp_path / "run.yaml", "storage.options.s3.endpoint_ulr", 6), msg
    assert "did you mean 'storage.options.s3.endpoint_url'? allowed options: " in msg
    msg = error(tmp_path, MINIMAL, "storage.options={s3a: {secert: x}}")
    assert "storage.options.s3a.secert: " in msg and "did you mean" in msg
    assert "'storage.options.s3a.secret'" in msg


def test_what_s3fs_hands_on_is_allowed_and_what_it_cannot_is_not(tmp_path: Path) -> None:
    # aiobotocore's session (profile), fsspec's listing and instance caches, botocore's config
    given = (
        "      profile: default\n      use_listings_cache: false\n"
        "      listings_expiry_time: 5\n      skip_instance_cache: true\n"
        "      config_kwargs: {connect_timeout: 3}\n      requester_pays: false\n"
    )
    assert load(tmp_path, _s3(given)).storage.options["s3"]["profile"] == "default"
    # fsspec's async base takes batch_size, but s3fs does not pass it there: its session
    # would refuse it at the first request
    msg = error(tmp_path, _s3("      batch_size: 4\n"))
    assert "storage.options.s3.batch_size: unknown option" in msg, msg


def test_protocols_that_take_any_option_or_are_not_installed_are_not_checked(
    tmp_path: Path,
) -> None:
    options = "  options:\n    https: {headers: {X-Team: ctr}}\n    file: {auto_mkdir: true}\n"
    if importlib.util.find_spec("gcsfs") is None:
        options += "    gs: {project: p, some_option: 1}\n"
    cfg = load(tmp_path, MINIMAL + "storage:\n" + options)
    assert cfg.storage.options["https"] == {"headers": {"X-Team": "ctr"}}
    msg = error(tmp_path, MINIMAL + "storage:\n  options:\n    file: {auto_mkdri: true}\n")
    assert "storage.options.file.auto_mkdri: " in msg and "'storage.options.file.auto_mkdir'" in msg


def test_train_refuses_the_unknown_option_before_reaching_the_store(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Once a traceback ending in aiobotocore's ``TypeError`` at the first request; the
    options it takes, given to the server, reach it."""
    with s3_server() as server:
        url = server.bucket("clicks") + "/logs"
        server.fs().pipe(f"{url[5:]}/day=2024-01-01/part-0.tsv", b"1\t2\n")
        opts = {**server.options["s3"], "bogus_opt": 1}
        config = tiny_config(
            tmp_path / "run",
            tmp_path,
            data={"train": {"paths": [url]}},
            storage={"options": {"s3": opts}},
        )
        cfg = write_config(tmp_path / "run.yaml", config)
        got = cli_here(capfd, caplog, "train", str(cfg))
        assert got.returncode == 1, got.stderr
        assert "Traceback" not in got.stderr and "TypeError" not in got.stderr
        (line,) = [x for x in got.stderr.splitlines() if "error" in x]
        assert line.startswith(f"daskhps train: error: {cfg}:"), line
        assert ": storage.options.s3.bogus_opt: unknown option of the s3:// filesystem" in line
        assert KEY not in got.stderr and SECRET not in got.stderr
        assert not (tmp_path / "run").exists()
        allowed = {**server.options["s3"], "use_listings_cache": False, "max_paths": 10}
        storage.use_options({"s3": allowed})
        assert resolve_files(url) == [f"{url}/day=2024-01-01/part-0.tsv"]

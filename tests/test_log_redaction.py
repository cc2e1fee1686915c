"""No credential reaches a log line, at any verbosity (issue 43): once ``-vv`` printed
botocore's signed headers, ``Credential=<access key id>/...``. The storage options' and the
environment's credentials, and what stands where a signed request or URL carries one, are
masked on every handler of the driver and of each Dask worker (daskhps/_redact.py).

Real parts throughout: the command line in a subprocess training from and copying to an
S3-compatible server on 127.0.0.1 (tests/_s3.py), a real worker whose task fails quoting the
credentials, and a URL that s3fs signed."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from daskhps import _redact
from tests._clusters import WORKER_MEMORY
from tests._logs import generated_logs
from tests._runs import cli, tiny_config, write_config
from tests._s3 import KEY, SECRET, s3_server

ENV_SECRET = "daskhps-env-secret-value"  # AWS_SECRET_ACCESS_KEY of the worker's process


@pytest.mark.slow
def test_a_verbose_run_on_object_storage_logs_no_credential(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    logs = generated_logs(tmp_path_factory, days=2, rows_per_day=300, parts_per_day=1, seed=5)
    with s3_server() as server:
        url = server.upload(logs, server.bucket("clicks") + "/logs")
        server.bucket("copies")
        config = tiny_config(
            tmp_path / "run",
            logs,
            data={"train": {"paths": [url]}, "holdout": {"day": "last"}},
            checkpoint={"replicate_to": "s3://copies/run"},
            storage={"options": server.options},
        )
        got = cli("-vv", "train", str(write_config(tmp_path / "run.yaml", config)))
    out = got.stdout + got.stderr
    assert got.returncode == 0, got.stderr[-3000:]
    # Not vacuous: botocore logged the signed requests of the driver's listing and copy.
    signed = [x for x in out.splitlines() if x.startswith("DEBUG botocore") and "Credential=" in x]
    assert len(signed) > 5 and all("Credential=***/" in x for x in signed), signed[:2]
    assert KEY not in out and SECRET not in out


_WORKER = f"""
import logging, sys
from daskhps.distributed.cluster import start_cluster

KEY, SECRET = {KEY!r}, {SECRET!r}
options = {{"s3": {{"key": KEY, "secret": SECRET, "endpoint_url": "http://127.0.0.1:9"}}}}


def task():
    logging.getLogger("s3fs").warning(
        "signed with Credential=%s/20240101/us-east-1/s3/aws4_request and %s", KEY, {ENV_SECRET!r}
    )
    raise RuntimeError(f"the store said no to {{KEY}}:{{SECRET}}")


with start_cluster(
    n_workers=1, threads_per_worker=1, memory_limit={WORKER_MEMORY!r}, dashboard_address=None,
    storage_options=options,
) as handle:
    try:
        handle.client.submit(task, pure=False).result()
    except RuntimeError:
        pass
    for worker, lines in handle.client.get_worker_logs().items():
        for level, line in lines:
            print("FORWARDED", level, line.replace(chr(10), " "))
"""


def test_a_workers_log_lines_hold_no_credential(tmp_path: Path) -> None:
    """What a worker prints (Dask's handler; the last-resort one, for a library's warning
    where the worker set up no handler) and what it keeps for the client and the dashboard
    (``get_worker_logs``)."""
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": ENV_SECRET}
    got = subprocess.run(
        [sys.executable, "-c", _WORKER],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    out = got.stdout + got.stderr
    assert got.returncode == 0, out[-3000:]
    forwarded = [x for x in got.stdout.splitlines() if "Compute Failed" in x]
    assert forwarded and "the store said no to ***:***" in forwarded[0], got.stdout
    printed = [x for x in got.stderr.splitlines() if "signed with" in x]
    assert printed == ["signed with Credential=***/20240101/us-east-1/s3/aws4_request and ***"], (
        got.stderr
    )
    assert "Compute Failed" in got.stderr
    assert KEY not in out and SECRET not in out and ENV_SECRET not in out


def test_a_url_signed_by_s3fs_is_masked_in_a_log_line() -> None:
    """A presigned URL carries the key id (X-Amz-Credential), a signature and, with temporary
    credentials, the session token."""
    import s3fs

    token = "daskhps-test-session-token"
    urls = []
    with s3_server() as server:
        server.bucket("signed")
        for version in ("s3", "s3v4"):  # SigV2's AWSAccessKeyId=, SigV4's X-Amz-Credential=
            opts = server.options["s3"]
            config_kwargs = {**opts["config_kwargs"], "signature_version": version}
            fs = s3fs.S3FileSystem(
                skip_instance_cache=True, **{**opts, "config_kwargs": config_kwargs}, token=token
            )
            fs.pipe("signed/x", b"1")
            urls.append(fs.url("signed/x", expires=60))
    assert all(KEY in url and token in url for url in urls), urls
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("tests.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        _redact.install()
        for url in urls:
            logger.warning("fetched %s", url)
        try:
            raise OSError(f"refused {urls[1]}")
        except OSError:
            logger.exception("with its traceback")
        logger.warning("http://AKIAUSER:%s@host/x", "pa55word")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert "AWSAccessKeyId=***" in text and "X-Amz-Credential=***" in text, text
    assert "Traceback" in text and "refused http" in text and "http://***@host/x" in text
    assert KEY not in text and token not in text and "pa55word" not in text
    assert "AKIAUSER" not in text
    for url in urls:
        signature = url.split("Signature=", 1)[1].split("&", 1)[0]
        assert signature not in text

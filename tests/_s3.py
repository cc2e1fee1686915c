"""An S3-compatible server on 127.0.0.1 for the object-storage tests: moto's server mode in a
process of its own (the way s3fs's own tests run it), reached over HTTP through s3fs, by the
test process and by every worker it starts.

``S3Server.options`` is the ``storage.options`` a config gives to reach it; the credentials
are fake and the server accepts any (moto's default), except :func:`s3_server` started with
``auth=True``, which knows no key at all (every request is refused: wrong credentials).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

s3fs = pytest.importorskip("s3fs", reason="the object-storage tests need s3fs (daskhps[s3])")
pytest.importorskip("moto.server", reason="the object-storage tests need moto[server]")

KEY, SECRET = "daskhps-test-key", "daskhps-test-secret"  # fake: the server takes any


@dataclass(frozen=True)
class S3Server:
    """A running server: ``endpoint`` is its ``http://127.0.0.1:PORT``, ``pid`` its process
    (scripts/bench_object_store.py counts its CPU seconds)."""

    endpoint: str
    pid: int

    @property
    def options(self) -> dict[str, Any]:
        """``storage.options`` reaching it (``s3`` only); botocore tries a refused
        connection once."""
        return {
            "s3": {
                "endpoint_url": self.endpoint,
                "key": KEY,
                "secret": SECRET,
                "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 5},
            }
        }

    def fs(self) -> Any:
        """A fresh s3fs filesystem on the server (not cached: each test sees the bucket as it
        is now)."""
        return s3fs.S3FileSystem(skip_instance_cache=True, **self.options["s3"])

    def bucket(self, name: str) -> str:
        """A new empty bucket named ``name``; its URL."""
        self.fs().mkdir(name)
        return f"s3://{name}"

    def upload(self, local: Path, url: str) -> str:
        """Every file under the folder ``local`` copied to ``url`` (keeping the tree); the
        URL."""
        fs = self.fs()
        for f in sorted(p for p in local.rglob("*") if p.is_file()):
            fs.put_file(str(f), f"{url.split('://', 1)[1]}/{f.relative_to(local).as_posix()}")
        return url


@contextmanager
def s3_server(auth: bool = False) -> Iterator[S3Server]:
    """Start the server on a free port of 127.0.0.1; stop it after."""
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "MOTO_ALLOW_NONEXISTENT_REGION": "true",
    }
    if auth:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"  # every request must name a known key
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        endpoint = None
        for line in proc.stdout:  # it prints its address once it listens
            if m := re.search(r"Running on (http://127\.0\.0\.1:\d+)", line):
                endpoint = m.group(1)
                break
        if endpoint is None:
            pytest.fail(f"the S3 server did not start (exit {proc.wait(10)})")
        # Keep reading its log so a full pipe never blocks it.
        import threading

        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield S3Server(endpoint, proc.pid)
    finally:
        proc.kill()
        proc.wait(10)


@contextmanager
def aws_environment() -> Iterator[None]:
    """The fake credentials and region in this process's environment (and so in every
    worker process it starts), restored after."""
    want = {
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in want}
    os.environ.update(want)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class CutProxy:
    """A TCP relay on 127.0.0.1 in front of ``endpoint`` (``http://127.0.0.1:PORT``) whose
    link can be cut and restored on the same port: a store that is unreachable for a while,
    as a network partition makes it, while the store itself keeps its objects."""

    def __init__(self, endpoint: str) -> None:
        import socket
        import threading

        self._upstream = ("127.0.0.1", int(endpoint.rsplit(":", 1)[1]))
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._server: socket.socket | None = None
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.restore()

    def restore(self) -> None:
        """Listen again on the same port (connections are refused until then)."""
        import socket
        import threading

        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(16)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def cut(self) -> None:
        """Stop listening and close every relayed connection."""
        import socket

        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(OSError):  # wakes the thread blocked in accept()
                server.shutdown(socket.SHUT_RDWR)
            server.close()
        with self._lock:
            conns, self._open = self._open, []
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self, server: Any) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # cut
            upstream = socket.create_connection(self._upstream)
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: Any, dst: Any) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.close()

"""A small client of ``daskhps serve`` (standard library only: no daskhps needed to call it)::

    from daskhps.serve.client import ServeClient

    client = ServeClient("http://127.0.0.1:8000")
    client.wait_ready()
    answer = client.predict([{"I1": 3, "C1": "68fd1e64"}, {"I1": 0}])
    answer.version, answer.probabilities        # 'v000002', [0.031, 0.027]

One client keeps one HTTP/1.1 connection open (reconnecting when the server closed it); use
one client a thread.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Prediction", "ServeClient", "ServeError"]


class ServeError(Exception):
    """The server refused a request: ``status`` and its ``message`` (which names the row and
    the field of a bad request)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Prediction:
    version: str
    probabilities: list[float]


class ServeClient:
    def __init__(self, url: str = "http://127.0.0.1:8000", timeout: float = 60.0) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"expected an http://HOST:PORT address, got {url!r}")
        self.host, self.port, self.timeout = u.hostname, u.port or 80, timeout
        self._conn: http.client.HTTPConnection | None = None

    def predict(self, rows: Sequence[Mapping[str, Any]]) -> Prediction:
        """Scores of rows keyed by the model's schema field names."""
        body = json.dumps({"rows": list(rows)}).encode()
        return self._prediction(self.request("POST", "/predict", body, "application/json"))

    def predict_lines(
        self, lines: str | bytes, content_type: str = "text/tab-separated-values"
    ) -> Prediction:
        """Scores of log lines in the model's own format (with or without the label)."""
        body = lines.encode() if isinstance(lines, str) else lines
        return self._prediction(self.request("POST", "/predict", body, content_type))

    def ready(self) -> bool:
        try:
            return self.request("GET", "/readyz")[0] == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until ``/readyz`` says ready; TimeoutError after ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > end:
                raise TimeoutError(f"{self.host}:{self.port} not ready after {timeout:g} s")
            time.sleep(0.1)

    def metrics(self) -> str:
        return self.request("GET", "/metrics")[1].decode()

    def request(
        self, method: str, path: str, body: bytes | None = None, content_type: str | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of one request on the kept connection."""
        headers = {"Content-Type": content_type} if content_type else {}
        for attempt in (0, 1):
            conn = self._conn or http.client.HTTPConnection(self.host, self.port, self.timeout)
            self._conn = conn
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()  # the server closed a kept-alive connection: once more, anew
                if attempt:
                    raise
                continue
            except BaseException:
                self.close()  # refused, timed out: the next request starts a connection
                raise
            if resp.getheader("Connection", "").lower() == "close":
                self.close()
            return resp.status, data
        raise AssertionError("unreachable")

    def _prediction(self, answer: tuple[int, bytes]) -> Prediction:
        status, data = answer
        doc = json.loads(data) if data else {}
        if status != 200:
            raise ServeError(status, str(doc.get("error", data[:200])))
        return Prediction(doc["version"], doc["probabilities"])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> ServeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

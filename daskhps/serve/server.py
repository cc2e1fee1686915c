"""``daskhps serve``: an HTTP endpoint that scores rows with a model version, refreshed from
published versions while it serves.

::

    POST /predict   {"rows": [...]} or log lines (daskhps.serve.requests)
                    -> 200 {"version": "v000002", "probabilities": [0.031, ...]}
                    -> 4xx {"error": "row 3: field 'I1': ..."}; 503 while the model loads
    GET  /healthz   200 while the process runs
    GET  /readyz    200 once the model and stores are open and the caches warmed, else 503
    GET  /metrics   Prometheus text (daskhps.serve.metrics)

One process: tornado's IO loop takes requests, reads and scores each on its own thread as it
comes (a hop to another thread would cost more than scoring a few rows) and answers it; it
swaps versions between two requests (daskhps.serve.online). A poll thread opens the model,
follows ``CURRENT`` and prepares a new version beside the served one. One process scores one
request at a time: a large one holds the others, ``/healthz`` and ``/metrics`` included, while
it is scored; ``--processes N`` scores N at once.

tornado because it already comes with distributed (no new dependency), serves HTTP/1.1
keep-alive from one loop, and binds with ``SO_REUSEPORT``: with ``processes > 1`` the parent
binds the port and spawns that many server processes that bind it too, and the kernel spreads
connections over them. They share the read-only stores through the page cache; each keeps its
own caches and dense model.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import tornado.httpserver
import tornado.netutil
import tornado.web

from daskhps import _redact, storage
from daskhps.data.parse import read_shard
from daskhps.errors import DaskHPSError
from daskhps.serve.metrics import ServerMetrics
from daskhps.serve.online import ModelSource, OnlineModel
from daskhps.serve.requests import RequestError
from daskhps.serve.score import CacheSizes

__all__ = ["ServeOptions", "Server", "serve"]

log = logging.getLogger(__name__)

# torch runs on one thread a process; with ``--threads N`` a request of this many rows or more
# runs on N. A second thread saves little on a forward of a few thousand rows of an idle
# machine, and where the cores are busy with other work each of its hand-offs waits for a
# core: 8 to 10 times slower at 4096 and 16384 rows on the shared 2-core VM (docs/serving.md).
PARALLEL_ROWS = 4096


@dataclass(frozen=True)
class ServeOptions:
    """How ``daskhps serve`` runs (its command-line options)."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    processes: int = 1
    poll_s: float = 5.0
    max_rows: int = 65536
    max_body_bytes: int = 64 << 20
    batch_size: int = 4096
    device_rows: int = 1 << 20
    host_bytes: int = 256 << 20
    device: str = "cpu"
    warmup: str | None = None
    threads: int = 1  # torch's threads a process for a request of PARALLEL_ROWS rows or more


class Server:
    """One server process: the HTTP endpoint over an :class:`OnlineModel` (opened in the
    background once :meth:`start` has bound the sockets, so ``/healthz`` answers at once)."""

    def __init__(self, options: ServeOptions, on_failure: Any = None) -> None:
        self.options = options
        self._on_failure = on_failure  # called (from the poll thread) if the model cannot open
        self.online: OnlineModel | None = None
        self.failed: str | None = None  # why the model could not be opened
        self.ready = threading.Event()
        self.poll_pool = ThreadPoolExecutor(1, thread_name_prefix="daskhps-poll")
        self.metrics = ServerMetrics(self._hit_rate, lambda: self.version or "")
        self._http: tornado.httpserver.HTTPServer | None = None
        self._poll_error: str | None = None
        self._started = time.perf_counter()
        self.threads = options.threads
        self._torch_threads = 0  # torch's threads now, as predict set them

    @property
    def version(self) -> str | None:
        return self.online.version if self.online is not None else None

    def _hit_rate(self) -> dict[str, float]:
        if self.online is None:
            return {}
        return dict(self.online.scorer.lookup.stats()["hit_rate"])

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, sockets: list[socket.socket]) -> None:
        """Serve on ``sockets`` from the running IO loop; the model opens on the poll thread
        (requests meanwhile get 503), then the poll of ``CURRENT`` starts."""
        app = tornado.web.Application(
            [
                (r"/predict", PredictHandler, {"server": self}),
                (r"/healthz", HealthHandler, {"server": self}),
                (r"/readyz", ReadyHandler, {"server": self}),
                (r"/metrics", MetricsHandler, {"server": self}),
            ],
            default_handler_class=NotFoundHandler,
            default_handler_args={"server": self},
        )
        # The limit is the handler's (a 413 that says so); tornado's only stops a body that
        # declares no length and never ends.
        self._http = tornado.httpserver.HTTPServer(
            app, max_body_size=self.options.max_body_bytes + (1 << 20)
        )
        self._http.add_sockets(sockets)
        loop = asyncio.get_running_loop()
        loop.run_in_executor(self.poll_pool, self._open)

    def _open(self) -> None:
        o = self.options
        torch.set_num_threads(self.threads)  # this thread's: the warmup, then each prepare
        try:
            sizes = CacheSizes(o.device_rows, o.host_bytes, o.device)
            online = OnlineModel(ModelSource(o.model), sizes, o.batch_size, o.max_rows)
            if o.warmup:
                frame, _ = read_shard(o.warmup, online.schema, labels="auto")
                if not len(frame):
                    raise DaskHPSError(
                        f"--warmup {o.warmup}: no row of it reads with the model's schema "
                        f"({online.schema.name}); give log rows of the logs the model trained on"
                    )
                online.score(frame)
            self.online = online
        except (DaskHPSError, OSError) as e:
            self.failed = str(e)
            print(f"daskhps serve: error: cannot serve {o.model}: {e}", file=sys.stderr)
            if self._on_failure is not None:
                self._on_failure()
            return
        self.ready.set()
        chosen = self.online.scorer.servable.chosen  # the run's best, when not its latest
        print(
            f"daskhps serve: {self.online.version}{f' ({chosen})' if chosen else ''} ready on "
            f"http://{o.host}:{o.port} "
            f"(pid {os.getpid()}, {time.perf_counter() - self._started:.1f} s)",
            flush=True,
        )

    async def poll(self) -> None:
        """Follow ``CURRENT`` every ``poll_s`` until stopped."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.options.poll_s)
            if self.online is None or not self.online.source.follows:
                continue
            try:
                await self.refresh_once(loop)
            except Exception as e:  # a damaged version: keep serving the one we have
                msg = f"cannot move to the version now current: {e}"
                if msg != self._poll_error:
                    log.warning("daskhps serve: %s; still serving %s", msg, self.version)
                self._poll_error = msg

    async def refresh_once(self, loop: asyncio.AbstractEventLoop | None = None) -> Any:
        """Move to the version ``CURRENT`` names if it is another one; the swap or None."""
        loop = loop or asyncio.get_running_loop()
        online = self.online
        if online is None:
            return None
        published = await loop.run_in_executor(self.poll_pool, online.changed)
        if published is None:
            return None
        prepared = await loop.run_in_executor(self.poll_pool, online.prepare, published)
        swap = online.swap(prepared)  # on the loop's thread: between two requests
        self._poll_error = None
        self.metrics.refreshes.labels(swap.how).inc()
        self.metrics.pause.set(swap.pause_seconds)
        # printed, as the ready line is: an operator reads which version answers from the log
        print(
            f"daskhps serve: now serving {swap.new} (was {swap.old}): {swap.how}, requests held "
            f"{swap.pause_seconds * 1e3:.1f} ms (pid {os.getpid()})",
            flush=True,
        )
        return swap

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()
        self.poll_pool.shutdown(wait=True)
        if self.online is not None:
            self.online.close()

    # -- requests --------------------------------------------------------------------------

    def predict(self, body: bytes, content_type: str) -> tuple[bytes, int]:
        """The answer to one request (JSON) and its number of rows (on the loop's thread: the
        rows are read and scored by one view, no swap between)."""
        online = self.online
        assert online is not None
        inputs = online.reader.read(body, content_type)
        threads = 1 if len(inputs) < PARALLEL_ROWS else self.threads
        if threads != self._torch_threads:
            torch.set_num_threads(threads)
            self._torch_threads = threads
        version, probs = online.score_inputs(inputs)
        doc = {"version": version, "probabilities": probs.tolist()}
        return json.dumps(doc).encode(), len(probs)


class _Handler(tornado.web.RequestHandler):
    def initialize(self, server: Server) -> None:
        self.server = server

    def set_default_headers(self) -> None:
        self.set_header("X-Daskhps-Pid", str(os.getpid()))  # before initialize: no server

    def answer(self, status: int, doc: dict[str, Any] | bytes) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(doc if isinstance(doc, bytes) else json.dumps(doc))
        self.server.metrics.answered(status)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # tornado's own refusals (a body over max_body_size, a bad method) as JSON too
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": self._reason}))


@tornado.web.stream_request_body
class PredictHandler(_Handler):
    """Reads the body as it comes, so one over the limit is refused (413) before it is held."""

    def prepare(self) -> None:
        self._t = time.perf_counter()
        self._chunks: list[bytes] = []
        self._size = 0
        self._over: int | None = None  # the size of a body over the limit
        limit = self.server.options.max_body_bytes
        declared = self.request.headers.get("Content-Length")
        if declared is None:
            # A chunked body: tornado's own limit would cut it with a bare 400, so read (and
            # drop) up to 4x the limit here too, and refuse beyond that as it comes.
            self.request.connection.set_max_body_size(4 * limit + (1 << 20))  # type: ignore[union-attr]
        elif declared.isdigit() and int(declared) > limit:
            self._over = int(declared)
            if self._over <= 4 * limit:
                # Read it (and drop it) so that a client that sends its whole body before it
                # reads the answer gets the 413; a far larger one only closes the connection.
                self.request.connection.set_max_body_size(self._over)  # type: ignore[union-attr]
            else:
                self._refuse_too_large()

    def _refuse_too_large(self) -> None:
        limit = self.server.options.max_body_bytes
        self.answer(
            413,
            {
                "error": f"the body is {self._over} bytes, over the limit of {limit} bytes "
                "(--max-body-mb); send fewer rows a request"
            },
        )

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        limit = self.server.options.max_body_bytes
        if self._over is None and self._size > limit:
            self._over, self._chunks = self._size, []  # a body without a length, too long
        if self._over is None:
            self._chunks.append(chunk)
        elif self._size > 4 * limit and not self._finished:
            self._over = self._size
            self._refuse_too_large()  # then the connection closes: the rest is not read

    def post(self) -> None:
        server = self.server
        if self._finished:  # refused while the body came
            return
        if self._over is not None:
            self._refuse_too_large()
            return
        if server.online is None:
            why = f"cannot serve: {server.failed}" if server.failed else "the model is loading"
            self.answer(503, {"error": why})
            return
        body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        kind = self.request.headers.get("Content-Type", "")
        try:
            answer, rows = server.predict(body, kind)
        except RequestError as e:
            self.answer(e.status, {"error": str(e)})
            return
        except DaskHPSError as e:
            log.warning("daskhps serve: a request failed: %s", e)
            self.answer(500, {"error": str(e)})
            return
        self.answer(200, answer)
        server.metrics.scored(rows, time.perf_counter() - self._t)


class NotFoundHandler(_Handler):
    def prepare(self) -> None:
        self.answer(
            404,
            {
                "error": f"no such path: {self.request.method} {self.request.path}; this server "
                "answers POST /predict, GET /healthz, GET /readyz and GET /metrics"
            },
        )


class HealthHandler(_Handler):
    def get(self) -> None:
        self.answer(200, {"status": "alive", "pid": os.getpid()})


class ReadyHandler(_Handler):
    def get(self) -> None:
        s = self.server
        if s.ready.is_set():
            self.answer(200, {"status": "ready", "version": s.version})
        else:
            why = f"cannot serve: {s.failed}" if s.failed else "loading"
            self.answer(503, {"status": why})


class MetricsHandler(_Handler):
    def get(self) -> None:
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(self.server.metrics.text())


# -- processes ---------------------------------------------------------------------------


def _bind(options: ServeOptions) -> list[socket.socket]:
    with _port_in_use(options):
        return tornado.netutil.bind_sockets(
            options.port, options.host, family=socket.AF_INET, reuse_port=options.processes > 1
        )


@contextlib.contextmanager
def _port_in_use(options: ServeOptions) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        raise DaskHPSError(
            f"{options.host}:{options.port} is in use (another server?): pick another --port, "
            "or --port 0 for any free one"
        ) from None


def _hold(options: ServeOptions) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    with _port_in_use(options):
        s.bind((options.host, options.port))
    return s


def _run_one(options: ServeOptions, sockets: list[socket.socket] | None = None) -> int:
    """Serve in this process until SIGINT or SIGTERM."""
    sockets = sockets or _bind(options)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        server = Server(options, on_failure=lambda: loop.call_soon_threadsafe(stop.set))
        server.start(sockets)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        poller = asyncio.create_task(server.poll())
        await stop.wait()
        poller.cancel()
        server.stop()
        return 1 if server.failed else 0

    return asyncio.run(main())


def _child(options: ServeOptions) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    _redact.install()  # a child's own handlers: credentials stay out of its lines too
    sys.exit(_run_one(options))


def serve(options: ServeOptions) -> int:
    """Run ``daskhps serve``: one server process, or ``processes`` of them on one port."""
    if storage.is_url(options.model):  # a copy in object storage: fetched once, then fixed
        from daskhps.runfiles.copycache import fetched_model

        options = replace(options, model=fetched_model(options.model)[0])
    if not Path(options.model).exists():
        raise DaskHPSError(
            f"--model {options.model}: no such file or folder; give a retraining run "
            "directory, a version's folder, a checkpoint folder or a training run directory"
        )
    if options.warmup is not None and not storage.exists(options.warmup):
        raise DaskHPSError(f"--warmup {storage.shown(options.warmup)}: no such file")
    ModelSource(options.model).current()  # a retraining run with nothing published: say so
    if options.processes == 1:
        sockets = _bind(options)
        return _run_one(replace(options, port=sockets[0].getsockname()[1]), sockets)
    held = _hold(options)
    options = replace(options, port=held.getsockname()[1])
    # The parent keeps the port bound (not listening: it takes no connection) while its
    # children bind it too with SO_REUSEPORT; the kernel spreads connections over theirs.
    ctx = multiprocessing.get_context("spawn")
    children = [
        ctx.Process(target=_child, args=(options,), daemon=False) for _ in range(options.processes)
    ]
    for c in children:
        c.start()
    stopping = threading.Event()

    def stop(*_: Any) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    status = 0
    while not stopping.is_set():
        dead = [c for c in children if not c.is_alive()]
        if dead:
            print(
                f"daskhps serve: server process {dead[0].pid} exited with status "
                f"{dead[0].exitcode}; stopping the others",
                file=sys.stderr,
            )
            status = 1
            break
        stopping.wait(0.5)
    for c in children:
        if c.is_alive():
            c.terminate()
    for c in children:
        c.join(30)
    held.close()
    return status

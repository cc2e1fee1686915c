"""The embedded CPU cluster's worker processes, forked from one server that imported their
code once.

Dask starts each worker process of a ``LocalCluster`` with ``spawn``: a fresh interpreter that
imports distributed, then, with its first task, torch, torch's compiler front end (every torch
optimizer pulls it in) and daskhps: about 4 s of CPU per worker, paid again by every worker on
the same cores, before the run reads its first row. Here the embedded cluster's workers come
from multiprocessing's ``forkserver`` instead: :func:`warm_up` starts the server as soon as a
run knows it will start such a cluster, the server imports :data:`PRELOAD` once while the
driver checks the config and the data, and each worker is a fork of it that has nothing left
to import.

A forked worker sees what a spawned one would:

- the variables Dask sets before it spawns a worker (``distributed.nanny.pre-spawn-environ``:
  ``OMP_NUM_THREADS=1`` and the like, which libraries read when they load) are the server's
  environment, since the server is the process that loads them;
- the driver's environment as it is when the cluster starts, and its working directory, are
  handed to each worker (:func:`worker_env` through the nanny; the working directory through
  the worker setup plugin): a variable set after the server started (object-store credentials,
  say) still reaches the workers.

GPU clusters (``dask_cuda``) and clusters of separate ``dask worker`` processes keep their own
start method; so do platforms without ``forkserver``.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import dask

from daskhps._forkserver_exit import SERVER

if TYPE_CHECKING:
    from daskhps.config.cluster import ClusterConfig

__all__ = [
    "PRELOAD",
    "available",
    "forked_workers",
    "forks_workers",
    "warm_up",
    "warm_up_early",
    "warm_up_for",
    "worker_env",
]

_METHOD_KEY = "distributed.worker.multiprocessing-method"
_PRE_SPAWN_KEY = "distributed.nanny.pre-spawn-environ"

# What a worker of a training run imports: Dask's own (its forkserver default), then the
# modules the run's tasks load. A module that fails to import is skipped by the server.
PRELOAD = (
    "distributed",
    "numpy",
    "pandas",
    "pyarrow",
    "pyarrow.parquet",
    "dask.dataframe",
    "distributed.shuffle",
    "torch",
    "torch._dynamo",
    "daskhps.training.worker",
    "daskhps.training.holdout",
    "daskhps.runfiles.replica",
    "daskhps.training.placement",
    "daskhps.passes.scan",
    "daskhps.distributed.host",
    "daskhps._forkserver_exit",  # the server's exit skips the interpreter's teardown
)

_DASK_HASH_SEED = "6640"  # the seed a Dask nanny gives its workers

_lock = threading.Lock()
_started = False
# Whether a run's cluster will fork from the server: False while it was only started early, on
# the command line's guess (warm_up_early), and the run's config has not said so yet.
_wanted = False


def available() -> bool:
    return "forkserver" in multiprocessing.get_all_start_methods()


def warm_up() -> None:
    """Start the fork server now (once per process; later calls return at once). It imports
    :data:`PRELOAD` in the background, so the caller goes on with its own work."""
    global _wanted
    _start()
    _wanted = True


def warm_up_early() -> None:
    """Start the fork server before this process knows that its run forks workers: ``daskhps
    train`` guesses it from the command line, before its own seconds of imports, so that the
    server's imports run beside them. :func:`warm_up_for` then starts it for good, or stops
    it where the run's cluster forks nothing (an idle server holds torch's memory); so does
    this process's exit, where the command stopped before (a bad config, say): the server
    would go on importing, holding the command's output open, for seconds after it."""
    if _start():
        atexit.register(_stop_unwanted)


def _start() -> bool:
    """Start the server unless it runs; whether this call started it."""
    global _started
    if not available():
        return False
    with _lock:
        if _started:
            return False
        from multiprocessing import forkserver

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        pre_spawn = {**_pre_spawn_env(), SERVER: "1"}
        saved = {k: os.environ.get(k) for k in pre_spawn}
        os.environ.update(pre_spawn)  # read by the server's libraries as they load
        try:
            with _ctrl_c_ignored():
                forkserver.ensure_running()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        _started = True
    return True


@contextmanager
def _ctrl_c_ignored() -> Iterator[None]:
    """SIGINT ignored while the server is started, so that it starts ignoring it (a process
    inherits an ignored signal). A terminal's Ctrl-C reaches its whole process group, and the
    server protects itself from it only after its preload: a Ctrl-C in those seconds killed it
    mid-import, with a traceback below the driver's one-line message. Its forks, the workers,
    ignore SIGINT anyway (daskhps.distributed._worker_setup)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set a handler; the server is then as Python makes it
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def forks_workers(cluster: ClusterConfig) -> bool:
    """Whether ``cluster`` (``cluster.*``) starts an embedded CPU cluster of worker
    processes, the one kind whose workers are forked from the server."""
    return available() and cluster.processes and cluster.kind() == "local"


def warm_up_for(cluster: ClusterConfig) -> None:
    """:func:`warm_up` when ``cluster`` forks its workers, called as early as a run knows;
    otherwise a server started early, on a guess, and not yet wanted is stopped."""
    if forks_workers(cluster):
        warm_up()
    else:
        _stop_unwanted()


def _stop_unwanted() -> None:
    global _started
    with _lock:
        if not _started or _wanted:
            return
        from multiprocessing import forkserver

        # multiprocessing keeps no public handle on its server, nor a way to stop it
        server: Any = forkserver._forkserver
        pid = server._forkserver_pid
        if pid is not None:
            # Killed, not asked: it reads the request to stop only once it has imported
            # everything, seconds from now.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            server._stop()  # closes its pipe and reaps it
        _started = False


def worker_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment each forked worker is given: the driver's now, then Dask's pre-spawn
    variables and ``extra`` (``cluster.worker_env``) over it, as a spawned worker would have."""
    return {**os.environ, **_pre_spawn_env(), **dict(extra or {})}


def _pre_spawn_env() -> dict[str, str]:
    """What a nanny sets before it spawns a worker: Dask's pre-spawn variables (the driver's
    own value first), and a fixed hash seed where none is set, so that every worker hashes
    strings alike."""
    import distributed  # noqa: F401  # its defaults (the pre-spawn variables) join dask's config

    config = dask.config.get(_PRE_SPAWN_KEY, {}) or {}
    env = {str(k): os.environ.get(str(k), str(v)) for k, v in config.items() if v is not None}
    if env.get("PYTHONHASHSEED", os.environ.get("PYTHONHASHSEED")) in (None, "0"):
        env["PYTHONHASHSEED"] = _DASK_HASH_SEED
    return env


@contextmanager
def forked_workers() -> Iterator[None]:
    """Within the block, Dask's nannies start their workers from the fork server (started
    here when :func:`warm_up` was not called). The caller checks :func:`available`."""
    warm_up()
    with dask.config.set({_METHOD_KEY: "forkserver"}):
        yield

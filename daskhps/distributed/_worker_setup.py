"""The worker plugin every cluster of a run gets first: how its workers report and stop, and
how they reach object storage (``storage.options``).

* ``Compute Failed`` blocks of errors daskhps raises on purpose are dropped
  (:mod:`daskhps.distributed._expected`): the driver prints them as one line. So are the
  warnings of tasks cancelled while a worker closes (after Ctrl-C, say).
* Worker processes of a cluster the driver started ignore Ctrl-C. A terminal sends SIGINT to
  the whole process group, so without this every worker dies on the spot, the driver's
  cleanup finds its ranks gone, and the user reads a worker-lost error and a worker's
  traceback instead of where to resume. The driver alone stops: it closes the shards (the
  stores' locks) and then the cluster, which ends the workers. Workers of a cluster given by
  address belong to someone else's terminal and keep theirs.
* A worker of the embedded CPU cluster is forked from a server started elsewhere
  (:mod:`daskhps.distributed._forkserver`): it moves to the driver's working directory, where
  a spawned worker would have started.
* The C allocator reuses freed blocks instead of mapping fresh pages for every tensor
  (:mod:`daskhps.distributed._allocator`).
* Every log handler of the worker (Dask's own, the ones that keep its log for the dashboard,
  the last-resort one that prints a library's warnings) masks credentials
  (:mod:`daskhps._redact`): the storage options' and the environment's.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Mapping
from typing import Any

from distributed import WorkerPlugin

from daskhps import _redact as redact
from daskhps.distributed._allocator import give_back_free_memory, reuse_freed_memory
from daskhps.distributed._expected import quiet_expected_errors, quiet_worker_close
from daskhps.storage import use_options

__all__ = ["PLUGIN_NAME", "WorkerSetup", "setup_workers"]

PLUGIN_NAME = "daskhps-worker-setup"


class WorkerSetup(WorkerPlugin):
    """``ignore_sigint``: workers in processes of their own ignore SIGINT (in-process workers
    share the driver's process, whose Ctrl-C is the driver's)."""

    name = PLUGIN_NAME
    # Registered again by every run, replacing the last run's on every worker: a cluster
    # given by address outlives its runs, and each run brings its own storage options.
    idempotent = False
    trims = False  # set up in a worker process of its own whose allocator was tuned

    def __init__(
        self,
        ignore_sigint: bool,
        storage_options: Mapping[str, Mapping[str, Any]] | None = None,
        cwd: str | None = None,
    ) -> None:
        self.ignore_sigint = ignore_sigint
        self.storage_options = dict(storage_options or {})
        self.cwd = cwd

    def __repr__(self) -> str:  # the storage options may hold credentials
        return f"WorkerSetup(ignore_sigint={self.ignore_sigint})"

    def setup(self, worker: Any) -> None:
        quiet_expected_errors()
        quiet_worker_close()
        # This run's options, and none of an earlier run's (a cluster outlives its runs).
        use_options(self.storage_options, replace=True)
        redact.install()
        own_process = multiprocessing.parent_process() is not None
        if self.cwd is not None and own_process:  # the embedded cluster's: the driver's
            os.chdir(self.cwd)
        self.trims = False
        if own_process:  # an in-process worker's allocator is the driver's to set
            self.trims = reuse_freed_memory()
        # signal.signal only works in the main thread, which runs a worker process's loop.
        main = threading.current_thread() is threading.main_thread()
        if self.ignore_sigint and own_process and main:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        # A task that ended leaves its freed blocks to the allocator: give them back, so the
        # memory monitor sees what the worker holds (see daskhps.distributed._allocator).
        if self.trims and start == "executing":
            give_back_free_memory()


def setup_workers(
    client: Any,
    *,
    ignore_sigint: bool,
    storage_options: Mapping[str, Mapping[str, Any]] | None = None,
    cwd: str | None = None,
) -> None:
    """Register :class:`WorkerSetup` on every worker, now and joining later; this process's
    own worker logger (in-process workers, the driver) is quieted too, and it reaches stores
    with ``storage_options`` too (``storage.options``: the workers read the logs and write
    the checkpoint copy)."""
    quiet_expected_errors()
    quiet_worker_close()
    use_options(storage_options or {})
    redact.install()  # Dask's handlers, added since the command line installed it
    client.register_plugin(WorkerSetup(ignore_sigint, storage_options, cwd), name=PLUGIN_NAME)

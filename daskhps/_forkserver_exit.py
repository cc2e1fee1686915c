"""The fork server of the embedded cluster's workers exits at once when the driver does: this
module is in what the server preloads (``daskhps._forkserver.PRELOAD``).

The server stops when the driver's end of its pipe closes, through the interpreter's ordinary
teardown: with torch, pandas and Dask loaded, 1.5-2 s of one core that frees each of their
objects in turn. It holds the driver's stdout and stderr until then (its workers write their
logs there), so whatever reads the driver's output (a pipe, a test, CI) waited that long
after the driver had exited. Its own state needs no teardown: it holds no file open for
writing, and its workers are processes of their own.

In the server, importing it registers an exit function that ends the process with
``os._exit``: the exit functions registered after it run first, then the teardown is skipped.
Its workers are forks of it, but a forked worker never runs exit functions: multiprocessing
ends each one with ``os._exit`` once its process function returns. Any other process that
imports this module is left alone: only the server is started with :data:`SERVER` in its
environment.
"""

from __future__ import annotations

import atexit
import os

__all__ = ["SERVER"]

SERVER = "DASKHPS_FORK_SERVER"

if os.environ.pop(SERVER, None) == "1":  # popped: the workers forked from it do not see it
    atexit.register(os._exit, 0)

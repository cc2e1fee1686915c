"""Keep Dask's ``Compute Failed`` block for failures nobody expected.

A Dask worker logs every task that raises at ERROR, with the task and its traceback, before
the client sees the exception. When daskhps raises one of its own errors on purpose (a bad
row under ``bad_rows: fail``, a store path it cannot create) the driver ends in one clear line,
and the block printed above it is noise. :class:`ExpectedErrorFilter` drops the block for those
errors only: the exception's class is a :class:`~daskhps.errors.DaskHPSError` and the raise is
in daskhps's own code. A genuine failure (a ``KeyError`` in a model, a pandas error, a daskhps
error class raised by someone else's code) keeps its traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

from daskhps.errors import DaskHPSError

__all__ = [
    "ExpectedErrorFilter",
    "SyncCancelRaceFilter",
    "quiet_expected_errors",
    "quiet_sync_cancel_race",
    "quiet_worker_close",
    "quiet_worker_kills",
]

PACKAGE = str(Path(__file__).resolve().parents[1])  # the daskhps folder
WORKER_LOGGER = "distributed.worker"  # where Worker.execute logs "Compute Failed"

_CLASS = re.compile(r"\s*([A-Za-z_][\w.]*)\(")  # repr(exception): Name(args...)
_FRAME = re.compile(r'File "([^"]+)", line \d+')


def _error_names() -> set[str]:
    """Names of every daskhps error class defined so far (subclasses live in several modules)."""
    names, todo = set(), [DaskHPSError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def raised_by_daskhps(exception_text: str, traceback_text: str) -> bool:
    """Whether a failed task's exception (its ``repr``) is a daskhps error raised by daskhps:
    its class is a :class:`DaskHPSError` and the innermost frame is in the daskhps package."""
    cls = _CLASS.match(exception_text)
    if cls is None or cls.group(1).rsplit(".", 1)[-1] not in _error_names():
        return False
    frames = _FRAME.findall(traceback_text)
    return bool(frames) and str(Path(frames[-1]).resolve()).startswith(PACKAGE + os.sep)


class ExpectedErrorFilter(logging.Filter):
    """Drops ``distributed.worker``'s ``Compute Failed`` records of errors daskhps raised on
    purpose; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith("Compute Failed")):
            return True
        args = record.args
        # (key, state, task, exception text, traceback text): the format of Worker.execute
        if not isinstance(args, tuple) or len(args) < 5:
            return True
        exception_text, traceback_text = args[3], args[4]
        if not isinstance(exception_text, str) or not isinstance(traceback_text, str):
            return True
        return not raised_by_daskhps(exception_text, traceback_text)


def quiet_expected_errors() -> None:
    """Install :class:`ExpectedErrorFilter` on this process's worker logger (once)."""
    logger = logging.getLogger(WORKER_LOGGER)
    if not any(isinstance(f, ExpectedErrorFilter) for f in logger.filters):
        logger.addFilter(ExpectedErrorFilter())


class _KillFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Worker process still alive after")


@contextlib.contextmanager
def quiet_worker_kills() -> Iterator[None]:
    """While closing a cluster daskhps started: no WARNING when a nanny kills a worker process
    that did not stop within its few seconds (one busy in a task, say, after Ctrl-C). The
    run is over and the kill is the cleanup asked for; nothing is left for the user to do."""
    logger, quiet = logging.getLogger("distributed.nanny"), _KillFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


class SyncCancelRaceFilter(logging.Filter):
    """Drops tornado's record of a race in ``distributed.utils.sync``: a Ctrl-C that lands
    before the synchronous call's coroutine has started makes its ``cancel`` callback read a
    variable not yet set (``NameError: cannot access free variable 'future'``). Nothing was
    running, so nothing is lost; the traceback would only bury the line that says where to
    resume. Any other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        if not info or not isinstance(info[1], NameError) or "'future'" not in str(info[1]):
            return True
        tb = info[2]
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        return tb is None or tb.tb_frame.f_code.co_name != "cancel"


def quiet_sync_cancel_race() -> None:
    """Install :class:`SyncCancelRaceFilter` on tornado's callback logger (once)."""
    logger = logging.getLogger("tornado.application")
    if not any(isinstance(f, SyncCancelRaceFilter) for f in logger.filters):
        logger.addFilter(SyncCancelRaceFilter())


class _CloseCancelFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not (msg.startswith("Async instruction for") and msg.endswith("CancelledError"))


def quiet_worker_close() -> None:
    """Install a filter on this process's worker state machine logger (once) that drops its
    WARNING for each task cancelled while the worker closes ("Async instruction for <Task
    ...> ended with CancelledError", which Dask says happens only in ``Worker.close``).
    After Ctrl-C, or when a run ends mid-shuffle, the cluster closes with tasks in flight;
    the user has nothing to do about them and the lines would bury the driver's last line."""
    logger = logging.getLogger("distributed.worker.state_machine")
    if not any(isinstance(f, _CloseCancelFilter) for f in logger.filters):
        logger.addFilter(_CloseCancelFilter())

"""Pinned Dask tasks: one task per worker, each on its own worker, results in rank order."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from distributed import wait

from daskhps._scheduler import scheduler_workers
from daskhps.distributed._errors import WorkerLostError

__all__ = ["missing_workers", "run_pinned"]

_POLL_S = 0.25


def missing_workers(client: Any, addresses: Sequence[str]) -> list[int]:
    """Ranks whose worker address is no longer in the cluster."""
    alive = set(scheduler_workers(client))
    return [r for r, a in enumerate(addresses) if a not in alive]


def run_pinned(
    client: Any,
    addresses: Sequence[str],
    fn: Callable[..., Any],
    *args: Any,
    rank_args: Sequence[Sequence[Any]] | None = None,
    what: str = "task",
    timeout_s: float | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*rank_args[r], *args, **kwargs)`` on worker ``addresses[r]`` for every rank.

    The tasks run concurrently (gang scheduled: each worker needs a free thread), never move
    to another worker, and are never cached (``pure=False``). A rank whose worker leaves the
    cluster fails the call at once with :class:`WorkerLostError` instead of leaving its task
    waiting for a worker that will never return; the first task error is re-raised as is.
    """
    lost = missing_workers(client, addresses)
    if lost:
        raise _lost_error(lost, addresses, what)
    futures = [
        client.submit(
            fn,
            *(rank_args[r] if rank_args is not None else ()),
            *args,
            workers=[addr],
            allow_other_workers=False,
            pure=False,
            key=f"daskhps-{what.replace(' ', '-')}-{r}-{time.monotonic_ns()}",
            **kwargs,
        )
        for r, addr in enumerate(addresses)
    ]
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pending = set(futures)
    try:
        while pending:
            _wait_a_little(pending)
            for f in [f for f in pending if f.done()]:
                if f.status == "error":
                    f.result()  # re-raises the worker's exception with its traceback
                pending.discard(f)
            if not pending:
                break
            # A pinned task of a vanished worker never runs: fail now, naming the rank.
            lost = missing_workers(client, addresses)
            if lost:
                raise _lost_error(lost, addresses, what)
            if deadline is not None and time.monotonic() > deadline:
                ranks = [r for r, f in enumerate(futures) if f in pending]
                raise WorkerLostError(
                    f"{what}: rank(s) {ranks} did not finish within {timeout_s:g} s "
                    f"(workers {[addresses[r] for r in ranks]}); a worker is stuck or has "
                    "no free thread: give workers more threads or raise the timeout"
                )
        return [f.result() for f in futures]
    finally:
        # Nothing may keep running or waiting after a failure (or Ctrl-C).
        client.cancel([f for f in futures if not f.done()])


def _wait_a_little(pending: set[Any]) -> None:
    """Wait until one of ``pending`` finishes, or ``_POLL_S``.

    ``distributed.wait`` says "not yet" by raising ``TimeoutError`` from inside its ``sync``,
    whose frame keeps the exception in a closure cell: exception -> traceback -> frames ->
    that cell -> exception, a reference cycle. Its frames include this call's callers, whose
    locals hold the pass's futures, so each poll would keep a pass's data on the workers until
    the cycle collector happens to run (seen as worker memory growing pass after pass, for
    minutes). Dropping the traceback breaks the cycle at once.
    """
    try:
        wait(list(pending), timeout=_POLL_S, return_when="FIRST_COMPLETED")
    except TimeoutError as e:
        e.__traceback__ = None
        e.__context__ = None


def _lost_error(lost: list[int], addresses: Sequence[str], what: str) -> WorkerLostError:
    names = ", ".join(f"rank {r} ({addresses[r]})" for r in lost)
    return WorkerLostError(
        f"{what}: {names} left the cluster (worker died, was killed or restarted); the "
        "run cannot continue with a missing rank: restart it (it resumes from its last "
        "checkpoint) and check the worker's log for the cause (memory limit?)"
    )

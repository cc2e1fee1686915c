"""Pinned Dask tasks: one task per worker, each on its own worker, results in rank order."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from distributed import wait

from daskhps._scheduler import scheduler_workers
from daskhps.distributed._errors import WaitStopped, WorkerLostError
from daskhps.distributed.paused import PAUSED_FOR_S, PauseWatch

__all__ = ["gather_pinned", "missing_workers", "run_pinned", "stop_waits_when"]

_POLL_S = 0.25

# The stop event of the waits of this thread (stop_waits_when); a thread-local rather than an
# argument, so that a thread's waits reached through any call (RunGroup.on_shards, ...) obey it.
_local = threading.local()


@contextmanager
def stop_waits_when(event: threading.Event) -> Iterator[None]:
    """Within the block, a wait on pinned tasks in this thread fails with
    :class:`WaitStopped` within a poll of ``event`` being set (and cancels its tasks)."""
    before = getattr(_local, "stop", None)
    _local.stop = event
    try:
        yield
    finally:
        _local.stop = before


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
    paused_for_s: float = PAUSED_FOR_S,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*rank_args[r], *args, **kwargs)`` on worker ``addresses[r]`` for every rank.

    The tasks run concurrently (gang scheduled: each worker needs a free thread), never move
    to another worker, and are never cached (``pure=False``). A rank whose worker leaves the
    cluster fails the call at once with :class:`WorkerLostError` instead of leaving its task
    waiting for a worker that will never return; the first task error is re-raised as is. A
    rank whose worker stays paused for memory longer than ``paused_for_s`` fails it with
    :class:`WorkerPausedError`.
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
    return gather_pinned(client, futures, addresses, what, timeout_s, paused_for_s)


def gather_pinned(
    client: Any,
    futures: Sequence[Any],
    addresses: Sequence[str],
    what: str,
    timeout_s: float | None = None,
    paused_for_s: float = PAUSED_FOR_S,
) -> list[Any]:
    """The results of ``futures`` (rank ``r`` pinned to ``addresses[r]``), in rank order.

    Each result is fetched as soon as its task finishes. A rank whose worker leaves, before or
    after its task finished, fails the call with :class:`WorkerLostError`; so does a rank not
    done within ``timeout_s``. A worker paused for memory is warned about at once, and a rank
    whose worker stays paused for ``paused_for_s`` fails the call (:class:`WorkerPausedError`);
    so does this thread's stop event (:func:`stop_waits_when`), within a poll. Whatever has
    not finished is cancelled when the call fails.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    watch = PauseWatch(str(client.scheduler.address), addresses, what, paused_for_s)
    stop: threading.Event | None = getattr(_local, "stop", None)
    results: dict[int, Any] = {}
    try:
        while len(results) < len(futures):
            _wait_a_little([f for r, f in enumerate(futures) if r not in results])
            for r, f in enumerate(futures):
                if r not in results and f.done():
                    if f.status == "error":
                        f.result()  # re-raises the worker's exception with its traceback
                    _fetch(f, r, results)
            if len(results) == len(futures):
                break
            ranks = [r for r in range(len(futures)) if r not in results]
            if stop is not None and stop.is_set():
                raise WaitStopped(f"{what}: stopped while waiting on rank(s) {ranks}")
            _check_workers(scheduler_workers(client), addresses, ranks, what, watch)
            if deadline is not None and time.monotonic() > deadline:
                raise WorkerLostError(
                    f"{what}: rank(s) {ranks} did not finish within {timeout_s:g} s "
                    f"(workers {[addresses[r] for r in ranks]}); a worker is stuck or has "
                    "no free thread: give workers more threads or raise the timeout"
                )
        return [results[r] for r in range(len(futures))]
    finally:
        # Nothing may keep running or waiting after a failure (or Ctrl-C).
        client.cancel([f for f in futures if not f.done()])


def _check_workers(
    workers: Mapping[str, Any],
    addresses: Sequence[str],
    pending: list[int],
    what: str,
    watch: PauseWatch,
) -> None:
    """Fail the wait where a rank's worker has left, or stayed paused too long.

    A pinned task of a vanished worker never runs, and a finished one whose worker left before
    its result was fetched is rescheduled onto that same vanished worker: either waits forever.
    So does a task pinned to a worker Dask paused for memory, which says nothing (no-worker).
    """
    lost = [r for r, a in enumerate(addresses) if a not in workers]
    if lost:
        raise _lost_error(lost, addresses, what)
    watch.observe(workers, pending)


def _fetch(future: Any, rank: int, results: dict[int, Any]) -> None:
    """Fetch a finished task's result into ``results``, or leave it out if it is not there.

    "Finished" says the result exists on its worker, not that it can still be fetched: a worker
    that dies between the two takes the result with it, and an unbounded fetch would then wait
    for it forever. A bounded one returns; the caller's loss check names the rank.
    """
    try:
        results[rank] = future.result(timeout=_POLL_S)
    except TimeoutError as e:
        e.__traceback__ = None  # the reference cycle _wait_a_little explains
        e.__context__ = None


def _wait_a_little(pending: list[Any]) -> None:
    """Wait until one of ``pending`` finishes, or ``_POLL_S``.

    ``distributed.wait`` says "not yet" by raising ``TimeoutError`` from inside its ``sync``,
    whose frame keeps the exception in a closure cell: exception -> traceback -> frames ->
    that cell -> exception, a reference cycle. Its frames include this call's callers, whose
    locals hold the pass's futures, so each poll would keep a pass's data on the workers until
    the cycle collector happens to run (seen as worker memory growing pass after pass, for
    minutes). Dropping the traceback breaks the cycle at once.
    """
    try:
        wait(pending, timeout=_POLL_S, return_when="FIRST_COMPLETED")
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

"""Named kill points: the driver SIGKILLs itself at a chosen moment, for crash-resume tests.

``DASKHPS_KILL_AT=<point>[:<n>]`` names the point and, optionally, the pass: ``n`` is the
pass's 0-based position in the run's schedule (over all epochs); without it the first time
the point is reached. Points, in the order one pass meets them::

    stage              the pass's keys were just staged on the workers (maybe while the
                       previous pass trains)
    mid_pass           the pass's training tasks are running on every worker
    checkpoint_dense   the checkpoint's dense.pt and state.json are written, nothing else
    checkpoint_commit  the table shards committed the checkpoint, its manifest is not written
    after_checkpoint   the checkpoint is complete
    after_replica      its copy at checkpoint.replicate_to is complete (the copy's old files
                       are not removed yet)

and, in ``daskhps retrain`` (``n``: the chunk's position among those a ``--follow`` process
took; a scheduled run's one candidate is 0)::

    follow_listed      a follower listed the logs and chose its next chunk, nothing trained
    publish_frozen     the candidate is frozen as the next version (its folder and store
                       commits), the registry does not name it yet
    published          the registry and CURRENT name the new version, retention has not run

Tests reach each moment through these names, never through timers. Unset, nothing happens.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from daskhps.errors import ConfigError

__all__ = ["ENV", "POINTS", "check_env", "kill_point", "kill_when_running"]

ENV = "DASKHPS_KILL_AT"
POINTS = (
    "stage",
    "mid_pass",
    "checkpoint_dense",
    "checkpoint_commit",
    "after_checkpoint",
    "after_replica",
    "follow_listed",
    "publish_frozen",
    "published",
)

log = logging.getLogger(__name__)


def _armed() -> tuple[str, int | None] | None:
    spec = os.environ.get(ENV, "").strip()
    if not spec:
        return None
    point, _, n = spec.partition(":")
    if point not in POINTS or (n and not n.isdigit()):
        raise ConfigError(
            f"{ENV}={spec!r}: expected <point>[:<pass>] with point one of {', '.join(POINTS)} "
            "and pass a whole number; unset it to run normally"
        )
    return point, int(n) if n else None


def check_env() -> None:
    """:class:`ConfigError` now, not in the middle of a run, when the variable is malformed."""
    _armed()


def armed_at(point: str, position: int) -> bool:
    """Whether :envvar:`DASKHPS_KILL_AT` names ``point`` at schedule position ``position``."""
    armed = _armed()
    return armed is not None and armed[0] == point and armed[1] in (None, position)


def _die(point: str, position: int) -> None:
    log.warning("%s: killing the driver at %s of pass %d", ENV, point, position)
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)


def kill_point(point: str, position: int) -> None:
    """SIGKILL this process if :envvar:`DASKHPS_KILL_AT` names this point and pass."""
    if armed_at(point, position):
        _die(point, position)


# A task in one of these states has started: it runs, or it has run and the driver has not
# collected its result yet.
_STARTED = frozenset({"executing", "long-running", "memory", "error"})


def kill_when_running(
    client: Any, key_prefix: str, workers: int, position: int
) -> Callable[[], None]:
    """Arm ``mid_pass``: once a task whose key starts with ``key_prefix``, submitted after
    this call, has started on each of ``workers`` workers, SIGKILL the driver (watched from a
    daemon thread): while it runs or after it, before the driver has the pass's results.
    Watching for tasks that run at the moment of a look missed passes whose tasks ran between
    two looks: a worker's event loop answers late while its task holds the interpreter, on a
    loaded machine. Call this before submitting the tasks. Returns the function that disarms
    it (call it when the pass's tasks are done)."""
    done = threading.Event()
    if not armed_at("mid_pass", position):
        return done.set

    def started(dask_worker: Any) -> list[str]:
        return [
            str(key)
            for key, ts in dask_worker.state.tasks.items()
            if str(key).startswith(key_prefix) and ts.state in _STARTED
        ]

    def look() -> dict[str, list[str]]:
        try:
            return client.run(started)
        except Exception:  # the cluster is still settling: look again
            return {}

    earlier = {key for keys in look().values() for key in keys}  # an earlier pass's

    def watch() -> None:
        while not done.is_set():
            now = look()
            if sum(1 for keys in now.values() if set(keys) - earlier) >= workers:
                _die("mid_pass", position)
            time.sleep(0.005)

    threading.Thread(target=watch, name="daskhps-kill-mid-pass", daemon=True).start()
    return done.set

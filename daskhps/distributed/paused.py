"""Workers Dask has paused for memory, as the driver sees them.

Dask pauses a worker whose process memory passes ``distributed.worker.memory.pause`` (80% of
its memory limit by default): it starts no task until its memory falls below that line, and a
task pinned to it waits (``no-worker``) without an error. A run waiting on such a worker would
wait for ever, saying nothing. Here the driver reads each worker's status from the scheduler
(the same call that tells a lost worker), says a worker's pause at once, as a warning naming
the worker, its memory and the config keys that shrink it (a worker that keeps pausing is said
again at most once a minute, with its pauses since), and bounds a wait on a paused worker
(:class:`PauseWatch`): past :data:`PAUSED_FOR_S` it fails in one line instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dask.config
from dask.utils import format_bytes

from daskhps._text import counted
from daskhps.distributed._errors import WorkerPausedError

__all__ = ["LEVER", "PAUSED_FOR_S", "REPEAT_S", "PauseWatch", "note_pauses", "pause_line"]

log = logging.getLogger(__name__)

# How long a wait may sit on a paused worker before it fails. Dask resumes a worker once its
# memory falls (a task ends, a result is released), usually within seconds; minutes of pause
# mean the worker's working set does not fit its limit, and waiting longer only hides that.
PAUSED_FOR_S = 300.0

LEVER = (
    "raise cluster.memory_limit, or lower table.tiers.device.fraction, "
    "table.tiers.host.fraction or passes.examples_per_pass (docs/sizing.md)"
)

# A worker whose memory hovers at the pause line pauses and resumes every few seconds; saying
# each pause flooded the terminal (194 lines in 5 minutes of a run on memory-limited hosts).
# A worker's pause is said at once, then at most once every REPEAT_S, with the pauses since.
REPEAT_S = 60.0


@dataclass
class _Said:
    at: float  # when the worker's last pause was said (time.monotonic)
    unsaid: int = 0  # its pauses since then


# By scheduler: the workers paused at the last look (a pause is new when a worker was not),
# and when each worker's pause was last said.
_paused: dict[str, set[str]] = {}
_said: dict[str, dict[str, _Said]] = {}
_said_lock = threading.Lock()


def pause_line() -> float | None:
    """The fraction of its memory limit at which Dask pauses a worker (``None``: never)."""
    value = dask.config.get("distributed.worker.memory.pause", default=0.8)
    return float(value) if value else None


def describe(address: str, info: Mapping[str, Any]) -> str:
    """``worker <address> (<memory> of its <limit> limit, over Dask's pause line at 80%)``."""
    memory = (info.get("metrics") or {}).get("memory")
    limit = info.get("memory_limit")
    used = format_bytes(int(memory)) if memory is not None else "unknown memory"
    of = f" of its {format_bytes(int(limit))} limit" if limit else ""
    line = pause_line()
    over = (
        f", over Dask's pause line at {line:.0%} (distributed.worker.memory.pause)"
        if line is not None
        else ""
    )
    return f"worker {address} ({used}{of}{over})"


def note_pauses(
    scheduler: str,
    workers: Mapping[str, Mapping[str, Any]],
    repeat_s: float = REPEAT_S,
    now: float | None = None,
) -> list[str]:
    """Warn for each worker of ``workers`` (the scheduler's ``{address: info}``) newly paused,
    at most once every ``repeat_s`` per worker (a later line counts the pauses not said);
    returns the addresses paused now."""
    now = time.monotonic() if now is None else now
    paused = [a for a, info in workers.items() if info.get("status") == "paused"]
    say: list[tuple[str, int]] = []
    with _said_lock:
        before = _paused.get(scheduler, set())
        _paused[scheduler] = set(paused)
        said = _said.setdefault(scheduler, {})
        for address in (a for a in paused if a not in before):
            last = said.get(address)
            if last is None or now - last.at >= repeat_s:
                say.append((address, last.unsaid if last else 0))
                said[address] = _Said(now)
            else:
                last.unsaid += 1
    for address, unsaid in say:
        since = (
            f" (it paused {counted(unsaid, 'more time')} since this was last said)"
            if unsaid
            else ""
        )
        log.warning(
            "%s is paused by Dask for memory%s: it starts no task until its memory falls, and a "
            "run waiting on it fails after %g s; %s",
            describe(address, workers[address]),
            since,
            PAUSED_FOR_S,
            LEVER,
        )
    return paused


class PauseWatch:
    """One wait's view of pauses: fails the wait once a worker it waits on has stayed paused
    for ``paused_for_s`` (a pause that ends restarts the count)."""

    def __init__(
        self, scheduler: str, addresses: Sequence[str], what: str, paused_for_s: float
    ) -> None:
        self.scheduler = scheduler
        self.addresses = list(addresses)
        self.what = what
        self.paused_for_s = paused_for_s
        self._since: float | None = None

    def observe(self, workers: Mapping[str, Mapping[str, Any]], pending: Iterable[int]) -> None:
        """Note the pauses in ``workers``; raise :class:`WorkerPausedError` where a worker of
        the ``pending`` ranks has been paused longer than allowed."""
        paused = set(note_pauses(self.scheduler, workers))
        stuck = [r for r in pending if self.addresses[r] in paused]
        if not stuck:
            self._since = None
            return
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if now - self._since > self.paused_for_s:
            names = "; ".join(
                f"rank {r}: {describe(self.addresses[r], workers[self.addresses[r]])}"
                for r in stuck
            )
            raise WorkerPausedError(
                f"{self.what}: paused by Dask for memory for over {self.paused_for_s:g} s, its "
                f"task cannot start ({names}); {LEVER}"
            )

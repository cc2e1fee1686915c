"""How a long-running follower is stopped: SIGTERM or Ctrl-C finishes the chunk in hand, a
second one abandons it."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

__all__ = ["StopRequest"]

log = logging.getLogger("daskhps.retrain.follow")


class StopRequest:
    """SIGTERM and SIGINT while following: the first asks the follower to stop after the
    chunk in hand, a second abandons that chunk (``KeyboardInterrupt``). Installed in the main
    thread only (elsewhere, e.g. in tests, :meth:`set` stops it)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, less when a stop is asked for; whether one was."""
        return self._event.wait(seconds)

    def _handle(self, signum: int, frame: object) -> None:
        if self._event.is_set():
            raise KeyboardInterrupt  # the second: abandon the chunk in hand
        log.warning(
            "%s: finishing the chunk in hand, then stopping (again to abandon it)",
            signal.Signals(signum).name,
        )
        self._event.set()

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequest]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        # A signal the process was started ignoring (SIGINT in a shell's background job)
        # stays ignored, as it does for any command started so.
        heard = [
            s for s in (signal.SIGTERM, signal.SIGINT) if signal.getsignal(s) != signal.SIG_IGN
        ]
        before = {s: signal.signal(s, self._handle) for s in heard}
        try:
            yield self
        finally:
            for s, h in before.items():
                signal.signal(s, h)

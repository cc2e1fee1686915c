"""Terminal output of a run: batch progress from the workers, quiet mode for scheduled runs.

Progress bars (tqdm) are drawn by the generator and the trainer unless the run is quiet; see
``Trainer(progress=...)`` and ``GenerateConfig.ensure(progress=...)``. A pass trains inside one
task per worker, so the trainer's bar would only move when a pass ends; rank 0 therefore
reports its batch count as a Dask event (:func:`report_batches`), at most a few times a second,
and the driver moves the bar as the events arrive (:class:`BatchProgress`)::

    rank 0: train_pass ── report_batches(run, 7) ──► scheduler event topic ──► driver: bar += ...
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import warnings
from typing import Any, Literal

from daskhps._text import counted

__all__ = ["BatchProgress", "PassProgress", "progress_topic", "quiet_run", "report_batches"]

# A few events a second: enough for a bar, negligible next to a mini-batch (~10 ms or more).
_MIN_INTERVAL_S = 0.25
_last_report: dict[str, float] = {}


def progress_topic(run_id: str) -> str:
    return f"daskhps-progress-{run_id}"


def report_batches(run_id: str, done: int, total: int, *, force: bool = False) -> None:
    """On a worker: tell the driver that ``done`` of the pass's ``total`` batches are trained.

    Rate-limited; outside a Dask worker (a benchmark, a unit test) it does nothing.
    """
    now = time.monotonic()
    if not force and now - _last_report.get(run_id, 0.0) < _MIN_INTERVAL_S and done < total:
        return
    try:
        from distributed import get_worker

        worker = get_worker()
    except ValueError:  # not inside a Dask task
        return
    _last_report[run_id] = now
    worker.log_event(progress_topic(run_id), {"done": int(done), "total": int(total)})


class BatchProgress:
    """On the driver: move ``bar`` with the batch counts rank 0 reports during a pass.

    ``start_pass()`` before a pass's tasks start; ``end_pass(num_batches)`` after they finish
    (it tops the bar up to the pass's end, whatever events were lost or late).
    """

    def __init__(self, client: Any, run_id: str, bar: Any) -> None:
        self.client, self.topic, self.bar = client, progress_topic(run_id), bar
        self._lock = threading.Lock()
        self._shown = 0  # batches of the current pass already on the bar
        self._open = False
        client.subscribe_topic(self.topic, self._on_event)

    def _on_event(self, event: Any) -> None:
        _, msg = event
        with self._lock:
            if not self._open:
                return  # a late event of a pass already topped up
            ahead = int(msg.get("done", 0)) - self._shown
            if ahead > 0:
                self.bar.update(ahead)
                self._shown += ahead

    def start_pass(self) -> None:
        with self._lock:
            self._shown, self._open = 0, True

    def end_pass(self, num_batches: int) -> None:
        with self._lock:
            if num_batches > self._shown:
                self.bar.update(num_batches - self._shown)
            self._shown, self._open = num_batches, False

    def close(self) -> None:
        try:
            self.client.unsubscribe_topic(self.topic)
        except Exception as e:  # the client may already be closing: a bar is not worth an error
            logging.getLogger(__name__).debug("unsubscribing from %s: %s", self.topic, e)


# What a run shows on the terminal: a bar (True), nothing (False), or one plain line per pass
# ("lines": stderr is a log file, where a bar's carriage returns make one endless line).
Progress = bool | Literal["lines"]


class PassProgress:
    """The driver's view of a run's passes: one bar ticking per batch (moved by rank 0's
    reports while a pass trains), the pass number and loss beside it, and the dashboard's
    pass column; with ``show="lines"`` one line per pass instead of the bar. Passes are
    numbered from 1 over the whole schedule."""

    def __init__(
        self,
        client: Any,
        run_id: str,
        addresses: list[str],
        *,
        total_passes: int,
        total_batches: int,
        batches_done: int,
        show: Progress,
    ) -> None:
        from tqdm.auto import tqdm

        from daskhps.monitor.worker_metrics import announce_pass

        self._announce = announce_pass
        self.client, self.addresses, self.total_passes = client, addresses, total_passes
        self.bar = tqdm(
            total=total_batches,
            initial=batches_done,
            unit="batch",
            disable=show is not True,
            desc="training",
        )
        self._lines = show == "lines"
        self._number = 0
        self._batches = BatchProgress(client, run_id, self.bar) if show is True else None

    def start_pass(self, number: int) -> None:
        self._number = number
        self.bar.set_description(f"pass {number}/{self.total_passes}")
        self._announce(self.client, self.addresses, number)
        if self._batches is not None:
            self._batches.start_pass()

    def end_pass(self, num_batches: int, loss: float, auc: float | None) -> None:
        if self._batches is not None:
            self._batches.end_pass(num_batches)
        else:
            self.bar.update(num_batches)
        self.bar.set_postfix(loss=f"{loss:.4f}", auc=auc)
        if self._lines:
            shown = f", auc {auc:.4f}" if auc is not None else ""
            print(
                f"pass {self._number}/{self.total_passes}: "
                f"{counted(num_batches, 'batch', 'batches')}, "
                f"loss {loss:.4f}{shown}",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self._batches is not None:
            self._batches.close()
        self.bar.close()

    def __enter__(self) -> PassProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def quiet_run() -> None:
    """Make this process quiet for a scheduled run: only warnings and errors of daskhps, and
    errors of Dask, reach the terminal (progress bars are the caller's to turn off).

    Dask's INFO and WARNING chatter (workers starting, a garbage-collection note) goes; the
    notice that the dashboard's port was taken goes too (the dashboard simply moves to a free
    port, see docs/monitoring.md); other Python warnings are logged as WARNING lines.
    """
    logging.getLogger("distributed").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r"Port \d+ is already in use", category=UserWarning)
    logging.captureWarnings(True)

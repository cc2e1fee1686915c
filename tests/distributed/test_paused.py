"""A worker Dask pauses for memory is said on the driver at once, and no wait on it is silent
or endless: a wait on pinned tasks fails in one line after its deadline, and a pass pipeline
whose preparing thread waits on it closes within seconds.

Once, both workers of a cluster sat over Dask's pause line: the pass's tasks stayed no-worker,
the driver polled for ever without a word, and closing the pipeline joined that wait without a
deadline, so the process never exited. Here one real worker process is pushed over its pause
line by memory it holds in a global (which Dask cannot spill).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import dask.config
import pytest

from daskhps._scheduler import scheduler_workers
from daskhps.distributed import WaitStopped, WorkerPausedError, run_pinned
from daskhps.distributed.paused import REPEAT_S, note_pauses
from tests.distributed import _memory

LIMIT = 512 << 20


@pytest.fixture
def paused() -> Iterator[tuple[Any, str]]:
    """A client and the address of its one worker, paused for memory."""
    from distributed import Client, LocalCluster

    line = float(dask.config.get("distributed.worker.memory.pause"))
    terminate = float(dask.config.get("distributed.worker.memory.terminate") or 1.0)
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            memory_limit=LIMIT,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        (address,) = scheduler_workers(client)
        # midway between the pause line and the line where the nanny kills the worker
        client.run(_memory.hold, int(LIMIT * (line + terminate) / 2))
        deadline = time.monotonic() + 15
        while scheduler_workers(client)[address].get("status") != "paused":
            assert time.monotonic() < deadline, "the worker was never paused"
            time.sleep(0.1)
        yield client, address


def _pause_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "paused by Dask for memory" in r.getMessage()
    ]


def test_a_paused_worker_is_said_once_naming_it_its_memory_and_the_lever(
    paused: tuple[Any, str], caplog: pytest.LogCaptureFixture
) -> None:
    client, address = paused
    scheduler = str(client.scheduler.address)
    caplog.set_level(logging.WARNING, logger="daskhps")
    for _ in range(5):  # every poll of every wait sees it: said once
        assert note_pauses(scheduler, scheduler_workers(client)) == [address]
    (said,) = _pause_warnings(caplog)
    assert address in said and "cluster.memory_limit" in said and "fraction" in said
    assert "MiB of its 512.00 MiB limit" in said, said
    # A worker that resumes and pauses again is said again, once a minute at most.
    client.run(_memory.let_go)
    workers = scheduler_workers(client)
    deadline = time.monotonic() + 15
    while workers[address].get("status") == "paused":
        assert time.monotonic() < deadline, "the worker never resumed"
        time.sleep(0.1)
        workers = scheduler_workers(client)
    assert note_pauses(scheduler, workers) == []
    client.run(_memory.hold, int(LIMIT * 0.9))
    deadline = time.monotonic() + 15
    later = time.monotonic() + REPEAT_S
    while not note_pauses(scheduler, scheduler_workers(client), now=later):
        assert time.monotonic() < deadline, "the worker was never paused again"
        time.sleep(0.1)
    assert len(_pause_warnings(caplog)) == 2


def _workers(*paused: str) -> dict[str, dict[str, str]]:
    return {a: {"status": "paused" if a in paused else "running"} for a in ("tcp://a", "tcp://b")}


def test_a_worker_that_keeps_pausing_is_said_once_a_minute_with_its_pauses_since(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="daskhps")
    scheduler = f"tcp://scheduler-{time.monotonic_ns()}"  # a scheduler of this test's own
    t = 1000.0
    assert note_pauses(scheduler, _workers("tcp://a"), now=t) == ["tcp://a"]
    for k in range(1, 6):  # it resumes and pauses again every 5 s: counted, not said
        note_pauses(scheduler, _workers(), now=t + 5 * k - 1)
        note_pauses(scheduler, _workers("tcp://a"), now=t + 5 * k)
    note_pauses(scheduler, _workers("tcp://b"), now=t + 30)  # another worker: said at once
    note_pauses(scheduler, _workers(), now=t + 59)
    note_pauses(scheduler, _workers("tcp://a"), now=t + REPEAT_S)  # a minute on: said
    said = _pause_warnings(caplog)
    assert [line.split(" ")[1] for line in said] == ["tcp://a", "tcp://b", "tcp://a"]
    assert "since this was last said" not in said[0] and "since" not in said[1]
    assert "paused by Dask for memory (it paused 5 more times since this was last said)" in said[2]


def test_a_wait_on_a_paused_worker_fails_in_one_line_within_its_deadline(
    paused: tuple[Any, str], caplog: pytest.LogCaptureFixture
) -> None:
    client, address = paused
    caplog.set_level(logging.WARNING, logger="daskhps")
    started = time.monotonic()
    with pytest.raises(WorkerPausedError) as caught:
        run_pinned(client, [address], _memory.echo, 1, what="stage ahead", paused_for_s=2.0)
    assert time.monotonic() - started < 15
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("stage ahead: ")
    assert address in message and "rank 0" in message and "limit" in message
    assert "cluster.memory_limit" in message and "passes.examples_per_pass" in message
    assert len(_pause_warnings(caplog)) == 1  # said at once, once, before the failure
    # its task was cancelled: nothing runs once the worker resumes
    assert not client.processing()[address]


def test_closing_a_pipeline_stops_its_preparing_thread_waiting_on_a_paused_worker(
    paused: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prepare thread waits (with the default deadline, minutes) on the paused worker; the
    pipeline is closed, as on Ctrl-C or a failure of the pass training beside it."""
    from daskhps.training import pipeline

    client, address = paused
    waiting = threading.Event()

    def prepare_pass(ctx: object, spec: object, position: int) -> Any:
        waiting.set()
        return run_pinned(client, [address], _memory.echo, position, what="stage ahead")

    monkeypatch.setattr(pipeline, "prepare_pass", prepare_pass)
    ctx: Any = None  # read only by prepare_pass, replaced above
    specs: list[Any] = [None]
    pipe = pipeline.PassPipeline(ctx, specs, 0, overlap=True)
    upcoming = pipe._prepare(0)
    assert waiting.wait(10)
    time.sleep(1.0)  # well inside the wait's polling
    assert not upcoming.done()
    closer = threading.Thread(target=pipe.close, daemon=True)
    started = time.monotonic()
    closer.start()
    closer.join(30)
    assert not closer.is_alive(), "closing the pipeline waited on the paused worker"
    assert time.monotonic() - started < 5
    assert isinstance(upcoming.exception(timeout=0), WaitStopped)
    assert not client.processing()[address]

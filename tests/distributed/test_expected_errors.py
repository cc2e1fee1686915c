"""Dask's ``Compute Failed`` block goes for errors daskhps raises on purpose, and stays for
every other failure, on a real cluster started as a run starts one (in-process workers, so
their log reaches ``caplog``; worker processes: tests/training/test_cli_stops.py)."""

from __future__ import annotations

import logging

import pytest

from daskhps.data.source import resolve_files
from daskhps.distributed import start_cluster
from daskhps.errors import ConfigError, DataError


def _lookup(d: dict, key: str) -> int:
    return d[key]  # a KeyError: a genuine failure


def _not_daskhps_code() -> None:
    raise ConfigError("raised by someone else's code")  # a daskhps class, not daskhps's raise


class _Keep(logging.Handler):
    """Records reaching ``distributed.worker``'s own handlers, past its filters: distributed's
    logging setup stops them from propagating to pytest's capture, depending on when it ran."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_compute_failed_only_for_what_daskhps_did_not_raise_on_purpose() -> None:
    logger, keep = logging.getLogger("distributed.worker"), _Keep()
    level = logger.level
    logger.addHandler(keep)
    logger.setLevel(logging.ERROR)
    try:
        with start_cluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
        ) as handle:
            client = handle.client
            missing = "/nonexistent/explode-*.tsv"  # a DataError raised in daskhps
            expected = client.submit(resolve_files, [missing], pure=False)
            with pytest.raises(DataError, match=r"explode-.*matched nothing"):
                expected.result()
            genuine = client.submit(_lookup, {}, "missing", pure=False)
            with pytest.raises(KeyError):
                genuine.result()
            foreign = client.submit(_not_daskhps_code, pure=False)
            with pytest.raises(ConfigError):
                foreign.result()
    finally:
        logger.removeHandler(keep)
        logger.setLevel(level)
    failed = [r.getMessage() for r in keep.records if r.getMessage().startswith("Compute")]
    assert len(failed) == 2, failed
    assert "KeyError('missing')" in failed[0] and "_lookup" in failed[0]
    assert "ConfigError" in failed[1] and "_not_daskhps_code" in failed[1]
    assert not any("explode" in m for m in failed)


def _sync_cancel_race() -> NameError:
    """The NameError distributed.utils.sync's ``cancel`` raises when Ctrl-C comes before its
    coroutine ran: a free variable read before it is set."""
    future: object

    def cancel() -> None:
        if future is not None:  # noqa: F821 - the race: not yet set
            pass

    try:
        cancel()
    except NameError as e:
        return e
    raise AssertionError("no NameError")


def test_the_sync_cancel_race_is_dropped_and_nothing_else() -> None:
    import sys

    from daskhps.distributed._expected import SyncCancelRaceFilter

    race = _sync_cancel_race()
    assert "free variable 'future'" in str(race)

    def record(exc: BaseException) -> logging.LogRecord:
        return logging.LogRecord(
            "tornado.application",
            logging.ERROR,
            __file__,
            1,
            "Exception in callback",
            None,
            (type(exc), exc, exc.__traceback__),
        )

    f = SyncCancelRaceFilter()
    assert not f.filter(record(race))
    try:
        raise NameError("name 'future' is not defined")  # raised here, not in a cancel
    except NameError:
        other = sys.exc_info()[1]
    assert other is not None and f.filter(record(other))
    assert f.filter(record(KeyError("future")))
    assert f.filter(logging.LogRecord("x", logging.ERROR, __file__, 1, "no exc", None, None))


def test_a_task_cancelled_by_a_closing_worker_is_dropped_and_nothing_else() -> None:
    import inspect

    import distributed.worker_state_machine as wsm

    from daskhps.distributed._expected import quiet_worker_close

    # The wording filtered is Dask's own: the test fails when Dask rewords the warning.
    assert 'f"Async instruction for {task} ended with CancelledError"' in inspect.getsource(wsm)
    logger = logging.getLogger("distributed.worker.state_machine")
    before = list(logger.filters)
    quiet_worker_close()
    quiet_worker_close()  # installed once
    try:
        installed = [f for f in logger.filters if type(f).__name__ == "_CloseCancelFilter"]
        assert len(installed) == 1

        def kept(msg: str) -> bool:
            rec = logging.LogRecord(logger.name, logging.WARNING, __file__, 1, msg, None, None)
            return bool(installed[0].filter(rec))

        task = "<Task cancelled name=\"execute(('shuffle-transfer-5a', 0))\" coro=<...>>"
        assert not kept(f"Async instruction for {task} ended with CancelledError")
        assert kept(f"Async instruction for {task} failed")
        assert kept("Compute Failed ... CancelledError")
    finally:
        logger.filters[:] = before

"""stage_span: nested spans add up, unknown stages are refused, tasks report to Dask."""

from __future__ import annotations

import time

import pytest
from distributed.metrics import context_meter

from daskhps.stages import CLIENT, STAGES, stage_seconds, stage_span


def _client_totals() -> dict[str, float]:
    return {stage: s for (_, stage), s in stage_seconds(CLIENT).items()}


def test_nested_spans_exclude_each_other_and_add_up():
    before = _client_totals()
    digested: list[tuple[object, float]] = []
    with context_meter.add_callback(lambda label, value, unit: digested.append((label, value))):
        t0 = time.perf_counter()
        with stage_span("read"):
            time.sleep(0.05)
            with stage_span("hash"):
                time.sleep(0.1)
        wall = time.perf_counter() - t0
    after = _client_totals()
    read = after["read"] - before.get("read", 0.0)
    hashed = after["hash"] - before.get("hash", 0.0)
    assert 0.1 <= hashed < 0.2
    assert 0.05 <= read < 0.1  # the inner hash span is not counted twice
    assert read + hashed == pytest.approx(wall, abs=0.01)
    # What Dask's fine performance metrics receive: the same two figures, one each.
    labels = [label for label, _ in digested]
    assert labels == ["hash", "read"]
    assert dict(digested)["read"] == pytest.approx(read)


def test_unknown_stage_is_refused_with_the_allowed_ones():
    span = stage_span("reading")
    with pytest.raises(ValueError, match="'reading' is not one of read, hash, dedup"):
        span.__enter__()
    assert "checkpoint" in STAGES and "write-back" in STAGES

"""``plan``'s memory figures against a real worker's memory on a real run: its growth, and
its peak with the worker process itself.

``scripts/bench_plan.py`` does the measuring: the resident set size (RSS) of the one worker
process of a LocalCluster, its peak read from the kernel's high-water mark, from just before
training (the worker already warmed: torch, daskhps and a dense model built once, so imports
and the allocator's start are not counted) to the peak of the run, against the growth of
``size_run(...).memory`` for the same config with the keys counted by ``--scan``; and the
peak itself against the memory's total. The tiers are
sized at tens of MB and the run has more distinct keys than device and host hold together, so
both tiers are filled (written, hence resident) and rows spill to the zarr store.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._scripts import run_script


@pytest.mark.slow
def test_plan_memory_within_20_percent_of_worker_growth(tmp_path: Path) -> None:
    rec, absolute = run_script("bench_plan.py", "--out", str(tmp_path), timeout=600)
    plan, growth = rec["value"], rec["baseline"]  # MiB
    # Every tier touched: the device tier full, the host tier (almost) full, every row
    # written to the store at the end. Nothing is read back from the store (its memory maps
    # would depend on the page cache): the upper tiers hold every key.
    keys, device, host = rec["distinct_keys"], rec["device_rows"], rec["host_rows"]
    assert keys is not None and host is not None
    assert device < keys <= device + host
    assert keys - device >= 0.9 * host
    assert rec["store_rows_written"] >= keys
    assert rec["rows_from_store"] == 0
    assert rec["plan_tiers_mib"] > 0.8 * plan  # the tiers dominate what is compared
    assert abs(plan - growth) <= 0.2 * growth, rec
    # The total, with the worker process itself: the peak the plan promises.
    total, peak = absolute["value"], absolute["baseline"]
    assert abs(total - peak) <= 0.2 * peak, absolute

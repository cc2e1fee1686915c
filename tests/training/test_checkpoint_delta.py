"""A delta checkpoint's size follows the rows touched since the previous one, not the table.

A checkpoint's table part is one commit of every shard store (``WorkerShards.commit``); its dense
part (dense.pt) does not depend on the table. So the bytes a commit adds to a real zarr store
on disk are what a delta checkpoint costs: ``scripts/bench_checkpoint.py`` measures them for a
200k-row table here, touching 100, 1,000 and 10,000 rows.
"""

from __future__ import annotations

import pytest

from daskhps.table import TableSpec
from daskhps.table.optimizers import OptimizerSpec
from tests._scripts import run_script

ROWS = 200_000

pytestmark = pytest.mark.slow  # ~10 s: a 200k-row table written to disk


def test_delta_commit_bytes_follow_touched_rows() -> None:
    recs = run_script("bench_checkpoint.py", "--rows", str(ROWS))
    row_bytes = TableSpec("bench", 16, OptimizerSpec(kind="adagrad", lr=0.1)).row_bytes
    base = recs[0]["value"] * 2**20
    assert base > ROWS * row_bytes  # the rows really are on disk
    deltas = [r["value"] * 2**10 for r in recs if r["name"].endswith("bytes added")]
    small, large = deltas[:2]  # 100 and 1,000 touched rows
    # each delta holds its rows (and keys), plus a fixed few KiB of metadata
    assert 100 * row_bytes <= small < 100 * row_bytes + 64 * 1024
    assert small < base / 100
    # ten times the touched rows: about ten times the rows' bytes more, whatever the table size
    rows_delta = large - small
    assert 0.8 * 900 * row_bytes < rows_delta < 1.5 * 900 * row_bytes + 16 * 1024

"""A delta checkpoint's size follows the rows touched since the previous one, not the table.

A checkpoint's table part is one commit of every shard store (``commit_shards``); its dense
part (dense.pt) does not depend on the table. So the bytes a commit adds to a real zarr store
on disk are what a delta checkpoint costs: measured here for a 200k-row table, touching 100
and then 1,000 rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from daskhps.table import EmbeddingTable, TableSpec
from daskhps.table.optimizers import OptimizerSpec

ROWS = 200_000

pytestmark = pytest.mark.slow  # ~10 s: a 200k-row table written to disk


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _touch(table: EmbeddingTable, keys: torch.Tensor) -> None:
    table.stage(keys)
    table.apply_gradients(keys, torch.full((len(keys), table.spec.dim), 0.01))
    table.unpin()


def test_delta_commit_bytes_follow_touched_rows(tmp_path: Path) -> None:
    spec = TableSpec("ads", 16, OptimizerSpec(kind="adagrad", lr=0.1))
    path = tmp_path / "rank-0"
    with EmbeddingTable.open(spec, path, device_rows=ROWS + 1000) as table:
        _touch(table, torch.arange(ROWS, dtype=torch.int64) * 7919)
        table.commit("pass-000001")  # the base: every row written once
        base = _bytes(path)
        assert base > ROWS * spec.row_bytes  # the rows really are on disk

        added = []
        for n in (100, 1000):
            before = _bytes(path)
            _touch(
                table, torch.randperm(ROWS, generator=torch.Generator().manual_seed(n))[:n] * 7919
            )
            table.commit(f"pass-{len(added) + 2:06d}")
            added.append(_bytes(path) - before)
    small, large = added
    # each delta holds its rows (and keys), plus a fixed few KiB of metadata
    assert 100 * spec.row_bytes <= small < 100 * spec.row_bytes + 64 * 1024
    assert small < base / 100
    # ten times the touched rows: about ten times the rows' bytes more, whatever the table size
    rows_delta = large - small
    assert 0.8 * 900 * spec.row_bytes < rows_delta < 1.5 * 900 * spec.row_bytes + 16 * 1024
    print(
        f"table {base / 2**20:.1f} MiB; delta of 100 rows {small / 1024:.1f} KiB, of 1000 rows "
        f"{large / 1024:.1f} KiB"
    )

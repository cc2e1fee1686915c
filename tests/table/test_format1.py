"""Stores written before rows had statistics (format 1) still open, read and train.

``format1/`` is such a store, written by that version (its README says how). Every test works
on a copy of it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from daskhps.errors import StoreMismatchError
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec
from daskhps.table.stats import STATS_WIDTH, row_stats
from daskhps.tiers.store import StoreOptions
from daskhps.tiers.store.check import StoreChecker
from daskhps.tiers.store.layout import FORMAT, layout_of_today

from .helpers import bits

FIXTURE = Path(__file__).parent / "format1"
SPEC = TableSpec("legacy", dim=4, optimizer=OptimizerSpec(kind="adam", lr=0.05), seed=5)
KEYS = torch.from_numpy(np.load(FIXTURE / "keys.npy"))
OLD_ROWS = torch.from_numpy(np.load(FIXTURE / "rows.npy"))  # 13 floats: no statistics


@pytest.fixture
def store(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE / "store", tmp_path / "store")
    return tmp_path / "store"


def _root(store: Path) -> dict[str, object]:
    attrs: dict[str, object] = json.loads((store / "zarr.json").read_text())["attributes"]
    return attrs["daskhps"]  # type: ignore[return-value]


def _files(store: Path) -> dict[str, bytes]:
    """Every file of the store but its lock (which a refused writer may leave, empty of rows)."""
    files = (p for p in store.rglob("*") if p.is_file() and p.name != "LOCK")
    return {str(p.relative_to(store)): p.read_bytes() for p in files}


def test_the_fixture_is_a_format_1_store_without_statistics() -> None:
    root = _root(FIXTURE / "store")
    assert root["format"] == 1 and root["width"] == SPEC.width - STATS_WIDTH == OLD_ROWS.shape[1]
    assert "row_stats" not in root["layout"]  # type: ignore[operator]


def test_read_only_it_reads_every_row_as_written_with_zero_statistics(store: Path) -> None:
    before = _files(store)
    with EmbeddingTable.open(SPEC, store, device_rows=8, mode="r") as table:
        rows = table.peek(KEYS)
    assert torch.equal(bits(rows[:, : SPEC.stats_at]), bits(OLD_ROWS))
    assert not bits(rows[:, SPEC.stats_at :]).any()  # count 0, last day not known
    assert _files(store) == before  # a reader writes nothing, not even the root
    assert StoreChecker(verify=True).check(store).damage == []


def test_a_writer_upgrades_the_root_and_both_widths_read_back(store: Path) -> None:
    with EmbeddingTable.open(SPEC, store, device_rows=64, store=StoreOptions()) as table:
        root = _root(store)
        assert root["format"] == FORMAT and root["width"] == SPEC.width
        assert root["narrow_width"] == SPEC.width - STATS_WIDTH
        assert root["layout"] == SPEC.layout()
        table.stage(KEYS[:10])
        table.record_seen(KEYS[:10], torch.full((10,), 3), 739_000)
        table.apply_gradients(KEYS[:10], torch.ones(10, SPEC.dim))
        table.unpin()
        table.commit("third")
        after = table.peek(KEYS)
    count, last = row_stats(after.clone(), SPEC.stats_at)
    assert count.tolist() == [3] * 10 + [0] * 50 and last.tolist() == [739_000] * 10 + [0] * 50
    # Untouched rows are the old ones, now from narrow segments beside wide ones.
    assert torch.equal(bits(after[10:, : SPEC.stats_at]), bits(OLD_ROWS[10:]))
    assert StoreChecker(verify=True).check(store).damage == []
    with EmbeddingTable.open(SPEC, store, device_rows=8, mode="r") as table:
        assert torch.equal(bits(table.peek(KEYS)), bits(after))
    # The commits from before the upgrade still open, their rows as they were.
    with EmbeddingTable.open(SPEC, store, device_rows=8, mode="r", commit="second") as table:
        assert torch.equal(bits(table.peek(KEYS)[:, : SPEC.stats_at]), bits(OLD_ROWS))
    with EmbeddingTable.open(SPEC, store, device_rows=8, mode="r", commit="first") as table:
        assert len(table.store) == 40


def test_compaction_rewrites_narrow_rows_at_full_width(store: Path) -> None:
    with EmbeddingTable.open(SPEC, store, device_rows=64) as table:
        report = table.store.compact(merge_below=1 << 20)  # merges both narrow segments
        assert report.segments_rewritten == 2
        table.commit("compacted")
        rows = table.peek(KEYS)
    assert _root(store)["narrow_width"] == SPEC.width - STATS_WIDTH  # older commits keep them
    assert torch.equal(bits(rows[:, : SPEC.stats_at]), bits(OLD_ROWS))
    assert StoreChecker(verify=True).check(store).damage == []
    with EmbeddingTable.open(SPEC, store, device_rows=8, mode="r") as table:
        assert torch.equal(bits(table.peek(KEYS)), bits(rows))


def test_another_layout_is_still_refused_and_nothing_changes(store: Path) -> None:
    before = _files(store)
    other = TableSpec("legacy", dim=4, optimizer=OptimizerSpec(kind="adagrad"), seed=5)
    for mode in ("r", "a"):
        with pytest.raises(StoreMismatchError, match="optimizer: stored 'adam', given 'adagrad'"):
            EmbeddingTable.open(other, store, device_rows=8, mode=mode)  # type: ignore[arg-type]
    assert _files(store) == before


def test_a_layout_of_format_1_reads_as_todays_and_no_other_does() -> None:
    old = _root(FIXTURE / "store")["layout"]
    assert isinstance(old, dict) and old != SPEC.layout()
    assert layout_of_today(old, SPEC.layout()) == SPEC.layout()  # what a checkpoint compares
    other = TableSpec("legacy", dim=8, optimizer=SPEC.optimizer, seed=5).layout()
    assert layout_of_today(old, other) != other
    assert layout_of_today(SPEC.layout(), other) == SPEC.layout()  # today's stays as it is

"""Bad input reaches the user as a clear error naming the table, tier and path; a rejected call
leaves the table and its store as they were."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from daskhps.errors import (
    CapacityError,
    CommitNotFoundError,
    DataError,
    StoreCorruptedError,
    StoreLockedError,
    StoreMismatchError,
    StoreNotFoundError,
)
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec

from .helpers import bits

SPEC = TableSpec("clicks", dim=4, optimizer=OptimizerSpec(kind="adagrad", lr=0.1), seed=1)
KEYS = torch.arange(10, dtype=torch.int64)


@pytest.fixture
def trained(tmp_path: Path) -> tuple[Path, torch.Tensor]:
    """A committed store, and its rows."""
    path = tmp_path / "store"
    with EmbeddingTable.open(SPEC, path, device_rows=16) as t:
        t.apply_gradients(KEYS, torch.ones(10, 4))
        t.commit("c0")
        rows = t.peek(KEYS)
    return path, rows


def _reopened_rows(path: Path) -> torch.Tensor:
    with EmbeddingTable.open(SPEC, path, device_rows=16, mode="r") as t:
        return t.peek(KEYS)


@pytest.mark.parametrize(
    "keys,match",
    [
        (torch.arange(3, dtype=torch.int32), "int64"),
        (torch.arange(3, dtype=torch.float32), "int64"),
        (np.arange(3, dtype=np.int32), "int64"),
        ([1, 2, 3], "int64"),
        (torch.zeros(2, 2, dtype=torch.int64), "1-D"),
    ],
)
def test_bad_keys(trained: tuple[Path, torch.Tensor], keys: object, match: str) -> None:
    path, rows = trained
    with EmbeddingTable.open(SPEC, path, device_rows=16) as t:
        for op in (t.lookup, t.stage, t.peek):
            with pytest.raises(DataError, match=match) as info:
                op(keys)  # type: ignore[operator]
            assert "'clicks'" in str(info.value) and str(path) in str(info.value)
        with pytest.raises(DataError, match=match):
            t.apply_gradients(keys, torch.ones(3, 4))  # type: ignore[arg-type]
        assert torch.equal(bits(t.peek(KEYS)), bits(rows))


@pytest.mark.parametrize(
    "grads,match",
    [
        (torch.ones(10, 5), r"shape \[10, 4\]"),
        (torch.ones(9, 4), r"shape \[10, 4\]"),
        (torch.ones(10, 4, dtype=torch.float64), "float32"),
        (torch.full((10, 4), float("nan")), "not finite"),
    ],
)
def test_bad_gradients_change_nothing(
    trained: tuple[Path, torch.Tensor], grads: torch.Tensor, match: str
) -> None:
    path, rows = trained
    with EmbeddingTable.open(SPEC, path, device_rows=16) as t:
        with pytest.raises(DataError, match=match) as info:
            t.apply_gradients(KEYS, grads)
        assert "'clicks'" in str(info.value)
        assert torch.equal(bits(t.peek(KEYS)), bits(rows))
        t.commit("c1")
    assert torch.equal(bits(_reopened_rows(path)), bits(rows))


def _negative_at_3() -> torch.Tensor:
    counts = torch.ones(10, dtype=torch.int64)
    counts[3] = -1
    return counts


@pytest.mark.parametrize(
    "counts,days,match",
    [
        (torch.ones(9, dtype=torch.int64), None, r"shape \(10,\) \(one per key\), got torch.int64"),
        (torch.ones(10), None, r"int32 or int64 tensor .* got torch.float32"),
        ([1] * 10, None, "int32 or int64 tensor .* got list"),
        (_negative_at_3(), None, "the count of key 3 is negative; nothing was counted"),
        (None, torch.ones(9, dtype=torch.int32), r"days must be one per key, shape \(10,\)"),
    ],
)
def test_bad_counts_change_nothing(
    trained: tuple[Path, torch.Tensor], counts: object, days: object, match: str
) -> None:
    path, rows = trained
    with EmbeddingTable.open(SPEC, path, device_rows=16) as t:
        with pytest.raises(DataError, match=match) as info:
            t.record_seen(KEYS, counts, days)  # type: ignore[arg-type]
        assert "'clicks'" in str(info.value)
        assert torch.equal(bits(t.peek(KEYS)), bits(rows))
        t.commit("c1")
    assert torch.equal(bits(_reopened_rows(path)), bits(rows))


@pytest.mark.parametrize(
    "other,field",
    [
        (TableSpec("clicks", dim=8, optimizer=SPEC.optimizer, seed=1), "dim"),
        (TableSpec("clicks", dim=4, optimizer=OptimizerSpec(kind="adam"), seed=1), "optimizer"),
        (TableSpec("clicks", dim=4, optimizer=OptimizerSpec(row_wise=True), seed=1), "row_wise"),
        (TableSpec("clicks", dim=4, optimizer=SPEC.optimizer, seed=2), "seed"),
    ],
)
def test_reopen_with_another_layout(
    trained: tuple[Path, torch.Tensor], other: TableSpec, field: str
) -> None:
    path, rows = trained
    with pytest.raises(StoreMismatchError, match=field) as info:
        EmbeddingTable.open(other, path, device_rows=16)
    assert str(path) in str(info.value)
    assert torch.equal(bits(_reopened_rows(path)), bits(rows))


def test_learning_rate_may_change_on_reopen(trained: tuple[Path, torch.Tensor]) -> None:
    path, rows = trained
    spec = TableSpec("clicks", dim=4, optimizer=OptimizerSpec(kind="adagrad", lr=0.5), seed=1)
    with EmbeddingTable.open(spec, path, device_rows=16) as t:
        assert torch.equal(bits(t.peek(KEYS)), bits(rows))


def test_second_writer_is_refused(trained: tuple[Path, torch.Tensor]) -> None:
    path, rows = trained
    with EmbeddingTable.open(SPEC, path, device_rows=16) as t:
        with pytest.raises(StoreLockedError) as info:
            EmbeddingTable.open(SPEC, path, device_rows=16)
        assert str(path) in str(info.value)
        # readers are welcome while a writer trains
        assert torch.equal(bits(_reopened_rows(path)), bits(rows))
        t.apply_gradients(KEYS, torch.ones(10, 4))
    # the lock is released on close
    EmbeddingTable.open(SPEC, path, device_rows=16).close()


def test_missing_store(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError) as info:
        EmbeddingTable.open(SPEC, tmp_path / "nowhere", device_rows=16, mode="r")
    assert "nowhere" in str(info.value)
    assert not (tmp_path / "nowhere").exists()


def test_unknown_commit(trained: tuple[Path, torch.Tensor]) -> None:
    path, _ = trained
    with pytest.raises(CommitNotFoundError, match="c0"):
        EmbeddingTable.open(SPEC, path, device_rows=16, commit="yesterday")


def test_damaged_store(trained: tuple[Path, torch.Tensor]) -> None:
    path, _ = trained
    chunk_files = [p for p in path.rglob("*") if p.is_file() and p.parent.name == "0"]
    assert chunk_files, "expected zarr chunk files in the store"
    for p in chunk_files:
        p.write_bytes(p.read_bytes()[:3])  # truncated by a crashed copy, say
    with pytest.raises(StoreCorruptedError) as info:
        EmbeddingTable.open(SPEC, path, device_rows=16).peek(KEYS)
    assert str(path) in str(info.value)


def test_stage_larger_than_device_tier(trained: tuple[Path, torch.Tensor]) -> None:
    path, rows = trained
    with EmbeddingTable.open(SPEC, path, device_rows=4) as t:
        with pytest.raises(CapacityError, match=r"staging 10 rows .* 4 rows") as info:
            t.stage(KEYS)
        assert "'clicks'" in str(info.value)
        t.stage(KEYS[:3])
        with pytest.raises(CapacityError, match="3 already pinned"):
            t.stage(KEYS[3:5])
        assert torch.equal(bits(t.peek(KEYS)), bits(rows))


def test_read_only_table_refuses_updates(trained: tuple[Path, torch.Tensor]) -> None:
    path, rows = trained
    with EmbeddingTable.open(SPEC, path, device_rows=16, mode="r") as t:
        with pytest.raises(DataError, match="read-only"):
            t.apply_gradients(KEYS, torch.ones(10, 4))
        assert torch.equal(bits(t.lookup(KEYS, read_only=True)), bits(rows[:, :4]))


def test_closing_with_uncommitted_rows_warns(
    trained: tuple[Path, torch.Tensor], caplog: pytest.LogCaptureFixture
) -> None:
    path, rows = trained
    t = EmbeddingTable.open(SPEC, path, device_rows=16)
    t.apply_gradients(KEYS[:3], torch.ones(3, 4))
    with caplog.at_level("WARNING", logger="daskhps.table.table"):
        t.close()
    assert "3 rows changed since its last commit" in caplog.text
    assert torch.equal(bits(_reopened_rows(path)), bits(rows))  # they were not kept


def test_closing_to_drop_uncommitted_rows_on_purpose_does_not_warn(
    trained: tuple[Path, torch.Tensor], caplog: pytest.LogCaptureFixture
) -> None:
    """An interrupted run drops them by design (it resumes from its last checkpoint): the
    'call commit() first' advice would mean nothing to whoever pressed Ctrl-C."""
    path, rows = trained
    t = EmbeddingTable.open(SPEC, path, device_rows=16)
    t.apply_gradients(KEYS[:3], torch.ones(3, 4))
    with caplog.at_level("WARNING", logger="daskhps.table.table"):
        t.close(uncommitted="drop")
    assert "commit" not in caplog.text
    assert torch.equal(bits(_reopened_rows(path)), bits(rows))  # dropped, as before

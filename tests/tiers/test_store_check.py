"""Checking a store's files against its metadata: sizes always, recorded sha256 sums on demand,
stores written before checksums were recorded still open and check (sizes only)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from daskhps.errors import StoreCorruptedError
from daskhps.tiers.store.arrays import RawArray, chunk_digests, write_array
from daskhps.tiers.store.check import StoreChecker
from daskhps.tiers.store.durable import file_sha256
from tests.tiers.test_zarr_store import W, keys_of, rows_of, state, store


@pytest.fixture
def two_commits(tmp_path: Path) -> Path:
    """c0: segment 1 (10 rows in chunks of 4: the last one padded) and an index snapshot;
    c1 adds segment 2 (replayed over c0's snapshot)."""
    path = tmp_path / "shard-0"
    with store(path, mode="w", snapshot_every=1, chunk_rows=4) as s:
        s.upsert(torch.arange(10), rows_of(torch.arange(10)))
        s.commit("c0")
    with store(path, snapshot_every=100, chunk_rows=4) as s:
        s.upsert(torch.arange(5), rows_of(torch.arange(5), 1.0))
        s.commit("c1")
    return path


def _chunk(path: Path, segment: int, array: str = "rows", chunk: int = 0) -> Path:
    parts = ["c", str(chunk)] + (["0"] if array == "rows" else [])
    return path.joinpath("segments", f"{segment:010d}", array, *parts)


def _arrays(path: Path) -> list[Path]:
    return sorted(p.parent for p in path.glob("*/*/*/zarr.json"))


def test_chunk_digests_are_the_sha256_of_the_files_zarr_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for name, data, chunk_rows in (
        ("rows", rng.standard_normal((10, 3)).astype(np.float32), 4),  # last chunk padded
        ("keys", rng.integers(0, 1 << 62, 9, dtype=np.int64), 3),  # no padding
        ("one", rng.standard_normal((5, 2)).astype(np.float32), 100),  # one chunk of 5 rows
        ("empty", np.empty((0, 3), dtype=np.float32), 4),  # no chunk file at all
    ):
        arr = write_array(tmp_path / name, data, chunk_rows)
        on_disk = [file_sha256(arr.chunk_file(i)) for i in range(arr.n_chunks)]
        assert arr.sha256 == tuple(on_disk) == tuple(chunk_digests(data, chunk_rows)), name
        assert RawArray.load(tmp_path / name, data.dtype).sha256 == arr.sha256


def test_every_segment_and_snapshot_records_its_checksums(two_commits: Path) -> None:
    arrays = _arrays(two_commits)
    assert len(arrays) == 6  # 2 segments x (keys, rows); the snapshot of c0 (keys, locs)
    for folder in arrays:
        meta = json.loads((folder / "zarr.json").read_text())
        n_chunks = -(-meta["shape"][0] // meta["chunk_grid"]["configuration"]["chunk_shape"][0])
        assert len(meta["attributes"]["sha256"]) == n_chunks
    found = StoreChecker(verify=True).check(two_commits, "c1")
    assert found.ok and (found.segments, found.snapshots, found.without_checksum) == (2, 1, 0)


def test_truncated_or_missing_chunk_files_are_named_by_size(two_commits: Path) -> None:
    truncated, missing = _chunk(two_commits, 2), _chunk(two_commits, 2, "keys")
    truncated.write_bytes(truncated.read_bytes()[:7])
    missing.unlink()
    found = StoreChecker().check(two_commits, "c1")
    assert found.damage == [
        f"chunk file {missing} is missing",
        f"chunk file {truncated} has 7 bytes, expected {4 * W * 4} (truncated)",
    ]
    assert StoreChecker().check(two_commits, "c0").ok  # c0 does not read segment 2
    (two_commits / "segments" / f"{1:010d}" / "rows" / "zarr.json").unlink()
    damage = StoreChecker().check(two_commits, "c0").damage
    assert damage == [f"array metadata {two_commits}/segments/0000000001/rows/zarr.json is missing"]


def test_a_changed_byte_is_found_by_verify_only(two_commits: Path) -> None:
    chunk = _chunk(two_commits, 1, chunk=1)
    data = bytearray(chunk.read_bytes())
    data[5] ^= 0x01
    chunk.write_bytes(bytes(data))
    assert StoreChecker().check(two_commits, "c1").ok  # same size: the sizes are right
    found = StoreChecker(verify=True).check(two_commits, "c1")
    assert found.verified and len(found.damage) == 1
    assert str(chunk) in found.damage[0] and "sha256" in found.damage[0]
    with store(two_commits, mode="r", commit="c0") as s:  # opening checks sizes only
        assert len(s) == 10


def test_commit_and_store_problems_are_named(two_commits: Path, tmp_path: Path) -> None:
    assert StoreChecker().check(two_commits).ok  # the latest commit
    damage = StoreChecker().check(two_commits, "c9").damage
    assert damage == [f"store {two_commits} has no commit 'c9' (its commits: ['c0', 'c1'])"]
    assert "no store at" in StoreChecker().check(tmp_path / "moved", "c0").damage[0]
    (two_commits / "segments" / f"{2:010d}" / "keys" / "zarr.json").unlink()
    (two_commits / "commits" / f"{2:010d}.json").write_text("{")
    assert "newest commit manifest" in StoreChecker().check(two_commits).damage[0]


def _strip_checksums(path: Path) -> None:
    """Make the store what daskhps wrote before it recorded checksums: arrays whose
    ``zarr.json`` has empty attributes."""
    for folder in _arrays(path):
        meta = json.loads((folder / "zarr.json").read_text())
        meta["attributes"] = {}
        (folder / "zarr.json").write_text(json.dumps(meta, indent=2))


def test_store_without_checksums_opens_and_checks_sizes(two_commits: Path) -> None:
    with store(two_commits, mode="r") as s:
        before = state(s)
    _strip_checksums(two_commits)
    with store(two_commits, mode="r") as s:
        assert state(s) == before
    found = StoreChecker(verify=True).check(two_commits, "c1")
    assert found.ok and (found.segments, found.snapshots, found.without_checksum) == (2, 1, 3)
    chunk = _chunk(two_commits, 1)
    data = bytearray(chunk.read_bytes())
    data[0] ^= 0x01
    chunk.write_bytes(bytes(data))
    assert StoreChecker(verify=True).check(two_commits, "c1").ok  # nothing to compare with
    chunk.write_bytes(bytes(data[:-1]))
    assert "truncated" in StoreChecker().check(two_commits, "c1").damage[0]
    chunk.write_bytes(bytes(data))
    # writing into an old store: new segments get checksums, the old ones stay as they are
    with store(two_commits, snapshot_every=100) as s:
        s.upsert(keys_of(42), rows_of(keys_of(42)))
        s.commit("c2")
    found = StoreChecker(verify=True).check(two_commits, "c2")
    assert found.ok and (found.segments, found.without_checksum) == (3, 3)


def test_store_error_names_no_python_argument(two_commits: Path) -> None:
    chunk = _chunk(two_commits, 2)
    chunk.write_bytes(chunk.read_bytes()[:7])
    with pytest.raises(StoreCorruptedError) as info:
        store(two_commits, mode="r")
    text = str(info.value)
    assert "commit=" not in text and "['c0']" in text and "--checkpoint NAME" in text


def test_attached_arrays_are_checked_and_named(tmp_path: Path) -> None:
    """A commit's attached arrays: a truncated chunk is found by size, a changed byte by
    verify; opening names the missing folder; bad names are refused and nothing is written."""
    path = tmp_path / "shard-0"
    counts = np.arange(10, dtype=np.int32)
    with store(path, mode="w") as s:
        s.upsert(torch.arange(3), rows_of(torch.arange(3)))
        s.commit("c0", attach={"counts": counts})
        with pytest.raises(Exception, match="attached array name 'Bad/name'"):
            s.commit("c1", attach={"Bad/name": counts})
        assert [c.name for c in s.commits()] == ["c0"]
    assert StoreChecker().check(path).ok
    chunk = next((path / "attached").glob("*/counts/c/0"))
    data = bytearray(chunk.read_bytes())
    data[0] ^= 1
    chunk.write_bytes(bytes(data))
    assert StoreChecker().check(path).ok  # same size
    assert any("counts" in d for d in StoreChecker(verify=True).check(path).damage)
    chunk.write_bytes(bytes(data[:-1]))
    assert any(str(chunk) in d for d in StoreChecker().check(path).damage)
    folder = chunk.parents[2]
    for f in sorted(folder.rglob("*"), reverse=True):
        f.unlink() if f.is_file() else f.rmdir()
    folder.rmdir()
    assert any("is missing" in d for d in StoreChecker().check(path).damage)
    with store(path) as s, pytest.raises(StoreCorruptedError, match=r"attached array .* missing"):
        s.attached("counts")


def test_deletion_records_are_checked_and_replayed(tmp_path: Path) -> None:
    """A delete writes a record of keys only: the checker checks it, reopening replays it,
    and its root is of today's format (older daskhps would take it for damage)."""
    path = tmp_path / "shard-0"
    with store(path, mode="w", snapshot_every=100) as s:
        s.upsert(torch.arange(6), rows_of(torch.arange(6)))
        assert s.delete(torch.tensor([1, 4, 99])) == 2
        with pytest.raises(Exception, match="duplicates"):
            s.delete(torch.tensor([2, 2]))
        s.commit("c0")
    assert StoreChecker(verify=True).check(path).ok
    with store(path, mode="r") as s:
        assert s.lookup(torch.arange(6)).found.tolist() == [True, False, True, True, False, True]
        assert len(s) == 4
    root = json.loads((path / "zarr.json").read_text())["attributes"]["daskhps"]
    assert root["format"] == 3
    record = next(p for p in (path / "segments").iterdir() if (p / "rows").exists() is False)
    chunk = record / "keys" / "c" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-1])
    assert any(str(chunk) in d for d in StoreChecker().check(path).damage)

"""The zarr store: bit-exact rows, commit points, crash safety, compaction, locking, errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
import zarr
from hypothesis import HealthCheck, given, settings

from daskhps.errors import (
    CommitNotFoundError,
    ConfigError,
    DataError,
    StoreCorruptedError,
    StoreExistsError,
    StoreLockedError,
    StoreMismatchError,
    StoreNotFoundError,
    StoreReadOnlyError,
)
from daskhps.tiers.store import StoreOptions, StoreReader, open_store
from daskhps.tiers.store.arrays import read_around_pays
from tests.tiers.conformance import MakeTier, TierConformance, odd_bits_rows, same_bits

W = 6
LAYOUT = {"table": "ads", "dim": 2, "width": W, "optimizer": "adam", "dtype": "float32"}


def store(path: Path, **kw: Any) -> StoreReader:
    """``open_store`` of a test store; the StoreOptions fields may be given as keywords."""
    args: dict[str, Any] = {"name": "ads/zarr", "width": W, "layout": LAYOUT}
    options = {k: kw.pop(k) for k in StoreOptions.key_names() if k in kw}
    args.update(kw)
    return open_store(path, options=StoreOptions(**options), **args)


def keys_of(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def rows_of(keys: torch.Tensor, salt: float = 0.0) -> torch.Tensor:
    return keys.to(torch.float32)[:, None] * 10 + torch.arange(W, dtype=torch.float32) + salt


def state(s: StoreReader) -> dict[int, bytes]:
    """Every row of a store, as raw bytes by key."""
    keys = s.keys()
    got = s.lookup(keys)
    assert bool(got.found.all())
    raw = got.rows.view(torch.int32).numpy()
    return {int(k): raw[i].tobytes() for i, k in enumerate(keys.tolist())}


def model_state(model: dict[int, torch.Tensor]) -> dict[int, bytes]:
    return {k: r.view(torch.int32).numpy().tobytes() for k, r in model.items()}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "shard-0"


class TestConformance(TierConformance):
    @pytest.fixture
    def make_tier(self, tmp_path: Path) -> Iterator[MakeTier]:
        made: list[StoreReader] = []

        def make(width: int, capacity_rows: int) -> StoreReader:
            s = open_store(
                tmp_path / f"s{len(made)}", name="t/zarr", width=width, layout={}, mode="w"
            )
            made.append(s)
            return s

        yield make
        for s in made:
            s.close()


# -- rows and commits --------------------------------------------------------------------


def test_rows_survive_bit_for_bit_across_reopen(path: Path) -> None:
    keys = keys_of(-(2**63), 2**63 - 1, -1, 0, 5, 1 << 40)
    rows = odd_bits_rows(len(keys), W)
    with store(path, mode="w") as s:
        s.upsert(keys, rows)
        assert same_bits(s.lookup(keys).rows, rows)
        s.commit("c0")
    with store(path, mode="r") as s:
        assert same_bits(s.lookup(keys).rows, rows)
        assert len(s) == len(keys)


def test_contains_reads_the_index_of_buffered_written_and_committed_rows(path: Path) -> None:
    probe = keys_of(-(2**63), 3, 7, 1 << 40, 9)
    with store(path, mode="w", write_buffer_rows=4) as s:
        assert s.contains(probe).tolist() == [False] * 5
        s.upsert(keys_of(3), rows_of(keys_of(3)))  # in the open segment
        s.upsert(keys_of(-(2**63), 1 << 40, 11, 12), rows_of(keys_of(1, 2, 11, 12)))  # on disk
        assert s.contains(probe).tolist() == [True, True, False, True, False]
        assert s.stats.rows_read == 0
        s.commit("c0")
    with store(path, mode="r") as s:
        assert s.contains(probe).tolist() == [True, True, False, True, False]
        with pytest.raises(DataError, match="contains"):
            s.contains(torch.zeros(2, dtype=torch.int32))


def test_overwrites_and_reopen_at_each_commit(path: Path) -> None:
    k = keys_of(1, 2, 3, 4)
    with store(path, mode="w", snapshot_every=2) as s:
        s.upsert(k, rows_of(k))
        s.commit("c0", {"pass": 0})
        s.upsert(k[1:3], rows_of(k[1:3], 100))
        s.upsert(keys_of(3, 9), rows_of(keys_of(3, 9), 200))
        info = s.commit("c1", {"pass": 1})
        assert info.rows == 5 and info.meta == {"pass": 1}
        s.upsert(k, rows_of(k, 300))  # never committed
    with store(path, mode="r") as s:
        assert [c.name for c in s.commits()] == ["c0", "c1"]
        assert s.latest_commit is not None and s.latest_commit.name == "c1"
        got = s.lookup(keys_of(1, 2, 3, 4, 9))
        assert torch.equal(got.rows[0], rows_of(keys_of(1))[0])
        assert torch.equal(got.rows[1], rows_of(keys_of(2), 100)[0])
        assert torch.equal(
            got.rows[2:4], rows_of(keys_of(3, 4), 0).add(torch.tensor([[200.0], [0]]))
        )
        assert torch.equal(got.rows[4], rows_of(keys_of(9), 200)[0])
    with store(path, mode="r", commit="c0") as s:
        assert len(s) == 4
        assert torch.equal(s.lookup(k).rows, rows_of(k))
        assert not bool(s.lookup(keys_of(9)).found.any())


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("upsert"), st.lists(st.integers(-5, 30), max_size=12, unique=True)),
            st.tuples(st.just("commit"), st.integers(0, 3)),
            st.tuples(st.just("reopen"), st.integers(0, 50)),
        ),
        max_size=14,
    ),
    snapshot_every=st.integers(1, 3),
    buffer=st.sampled_from([0, 7, 65536]),
)
def test_every_commit_reopens_to_its_own_state(
    tmp_path_factory: pytest.TempPathFactory, ops: list, snapshot_every: int, buffer: int
) -> None:
    """Random writes, commits (names reused) and writer reopens at earlier commits, against a
    dict model; afterwards each commit opens to exactly the state it was given."""
    path = tmp_path_factory.mktemp("model") / "store"
    s = store(path, mode="w", snapshot_every=snapshot_every, write_buffer_rows=buffer)
    model: dict[int, torch.Tensor] = {}
    committed: dict[str, dict[int, bytes]] = {}
    try:
        for i, (op, arg) in enumerate(ops):
            if op == "upsert":
                keys = torch.tensor(arg, dtype=torch.int64)
                rows = rows_of(keys, float(i))
                s.upsert(keys, rows)
                model.update(zip(arg, rows, strict=True))
            elif op == "commit":
                s.commit(f"c{arg}", {"i": i})
                committed[f"c{arg}"] = model_state(model)
            elif committed:
                name = sorted(committed)[arg % len(committed)]
                s.close()
                s = store(
                    path, commit=name, snapshot_every=snapshot_every, write_buffer_rows=buffer
                )
                model = {
                    k: torch.frombuffer(bytearray(b), dtype=torch.float32)
                    for k, b in committed[name].items()
                }
            assert state(s) == model_state(model)
        s.close()
        for name, want in committed.items():
            with store(path, mode="r", commit=name) as r:
                assert state(r) == want, name
    finally:
        s.close()


def test_commit_name_reused_replaces_it(path: Path) -> None:
    with store(path, mode="w") as s:
        s.upsert(keys_of(1), rows_of(keys_of(1)))
        s.commit("pass-1")
        s.upsert(keys_of(2), rows_of(keys_of(2)))
        s.commit("pass-1")
        assert [c.name for c in s.commits()] == ["pass-1"]
    with store(path, mode="r", commit="pass-1") as s:
        assert len(s) == 2


def test_snapshot_cadence_keeps_commits_small(path: Path) -> None:
    with store(path, mode="w", snapshot_every=3) as s:
        big = torch.arange(1000)
        s.upsert(big, rows_of(big))
        infos = []
        for i in range(6):
            k = keys_of(i)
            s.upsert(k, rows_of(k, 1.0))
            infos.append(s.commit(f"c{i}"))
    assert [c.snapshot for c in infos] == [False, False, True, False, False, True]
    # A commit without snapshot adds only its manifest: no index file.
    assert sorted(os.listdir(path / "index")) == ["0000000003", "0000000006", "zarr.json"]


def test_bad_commit_arguments_change_nothing(path: Path) -> None:
    with store(path, mode="w") as s:
        s.upsert(keys_of(1), rows_of(keys_of(1)))
        s.commit("c0")
        before = sorted(os.listdir(path / "commits"))
        with pytest.raises(DataError, match="JSON"):
            s.commit("c1", {"x": object()})
        with pytest.raises(DataError, match="non-empty"):
            s.commit("  ")
        assert sorted(os.listdir(path / "commits")) == before


# -- crash safety ----------------------------------------------------------------------


def test_crash_after_commit_reopens_last_commit(path: Path) -> None:
    """A writer process dies (no close, no commit) after writing more segments."""
    code = f"""
        import os, torch
        from daskhps.tiers.store import open_store
        s = open_store({str(path)!r}, name="ads/zarr", width={W}, layout={LAYOUT!r}, mode="w")
        k = torch.arange(10)
        s.upsert(k, torch.ones(10, {W}))
        s.commit("c0")
        s.upsert(k[:5], torch.full((5, {W}), 2.0))
        s.upsert(torch.arange(100, 110), torch.full((10, {W}), 3.0))
        s.flush()
        os._exit(0)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    # A commit torn half-way: its manifest tmp file was never renamed.
    (path / "commits" / "0000000002.json.tmp").write_text('{"name": "c1", "seq"')
    # A segment folder half-written by the crash, with an id above the others.
    (path / "segments" / "0000000042" / "rows").mkdir(parents=True)
    with store(path) as s:  # takes the lock: the dead writer's flock is gone
        assert [c.name for c in s.commits()] == ["c0"]
        assert len(s) == 10
        assert bool((s.lookup(torch.arange(10)).rows == 1).all())
        assert not bool(s.lookup(torch.arange(100, 110)).found.any())
        s.upsert(keys_of(0), torch.full((1, W), 5.0))
        s.commit("c1")
        assert (path / "segments" / "0000000043").is_dir()  # ids never reuse what is on disk
    with store(path, mode="r") as s:
        assert s.lookup(keys_of(0)).rows[0, 0] == 5.0
        assert bool((s.lookup(torch.arange(1, 10)).rows == 1).all())


def test_uncommitted_writes_are_not_in_the_reopened_state(path: Path) -> None:
    with store(path, mode="w") as s:
        s.upsert(keys_of(1), rows_of(keys_of(1)))
        s.flush()
    with store(path) as s:
        assert len(s) == 0 and s.commits() == []


# -- compaction and garbage ----------------------------------------------------------------


def test_compaction_keeps_every_kept_commit_and_frees_space(path: Path) -> None:
    k = torch.arange(2000)
    expected: dict[str, dict[int, bytes]] = {}
    with store(path, mode="w", snapshot_every=2) as s:
        model: dict[int, torch.Tensor] = {}
        for p in range(6):
            part = k if p == 0 else k[p * 300 : p * 300 + 400]
            rows = rows_of(part, float(p))
            s.upsert(part, rows)
            model.update(zip(part.tolist(), rows, strict=True))
            s.commit(f"p{p}")
            expected[f"p{p}"] = model_state(model)
        bytes_before = s.stats.extra["bytes_on_disk"]
        assert s.stats.extra["stale_fraction"] > 0.3
        dropped = s.drop_commits(keep=2)
        assert [c.name for c in dropped] == ["p0", "p1", "p2", "p3"]
        report = s.compact(min_stale=0.3)
        assert report.segments_rewritten >= 1 and report.rows_moved > 0
        assert state(s) == expected["p5"]
        s.commit("after")
        expected["after"] = expected["p5"]
        s.drop_commits(keep=1)
        assert s.stats.extra["stale_fraction"] < 0.3
        assert s.stats.extra["bytes_on_disk"] < bytes_before * 0.8
    with store(path, mode="r", commit="after") as s:
        assert state(s) == expected["after"]
    with pytest.raises(CommitNotFoundError, match="after"):
        store(path, mode="r", commit="p4")


def test_compaction_keeps_commits_not_dropped(path: Path) -> None:
    k = torch.arange(100)
    with store(path, mode="w", snapshot_every=1) as s:
        s.upsert(k, rows_of(k))
        s.commit("a")
        s.upsert(k[:90], rows_of(k[:90], 1.0))
        s.commit("b")
        a_state = None
        s.compact(min_stale=0.5)
        s.commit("c")
    with store(path, mode="r", commit="a") as r:
        a_state = state(r)
    assert a_state == model_state(dict(zip(k.tolist(), rows_of(k), strict=True)))


def test_drop_commits_removes_crash_leftovers(path: Path) -> None:
    with store(path, mode="w") as s:
        s.upsert(keys_of(1), rows_of(keys_of(1)))
        s.commit("c0")
        (path / "segments" / "0000000007").mkdir()
        s.drop_commits(keep=1)
        assert not (path / "segments" / "0000000007").exists()
        assert len(s) == 1


# -- locking and modes -------------------------------------------------------------------


def test_one_writer_per_store(path: Path) -> None:
    with store(path, mode="w"):
        with pytest.raises(StoreLockedError) as info:
            store(path)
        assert str(path) in str(info.value) and f"pid {os.getpid()}" in str(info.value)
        with store(path, mode="r") as reader:  # readers take no lock
            assert len(reader) == 0
    store(path).close()  # released on close


def test_writer_in_another_process_is_refused(path: Path) -> None:
    with store(path, mode="w"):
        code = f"""
            from daskhps.errors import StoreLockedError
            from daskhps.tiers.store import open_store
            try:
                open_store({str(path)!r}, name="ads/zarr", width={W}, layout={LAYOUT!r})
            except StoreLockedError as e:
                print("refused:", e)
        """
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.stdout.startswith("refused:"), out.stderr
    assert f"pid {os.getpid()}" in out.stdout


def test_read_only_never_writes(path: Path) -> None:
    with store(path, mode="w") as s:
        s.upsert(keys_of(1), rows_of(keys_of(1)))
        s.commit("c0")
    (path / "LOCK").unlink()
    listing = sorted(str(p) for p in path.rglob("*"))
    with store(path, mode="r") as r:
        assert r.read_only
        for call in (
            lambda: r.upsert(keys_of(2), rows_of(keys_of(2))),
            lambda: r.commit("x"),
            lambda: r.compact(),
            lambda: r.drop_commits(1),
        ):
            with pytest.raises(StoreReadOnlyError, match="mode='a'"):
                call()
    assert sorted(str(p) for p in path.rglob("*")) == listing


def test_closed_store_refuses_writes(path: Path) -> None:
    s = store(path, mode="w")
    s.close()
    with pytest.raises(StoreReadOnlyError, match="closed"):
        s.upsert(keys_of(1), rows_of(keys_of(1)))


def test_modes_and_missing_stores(path: Path, tmp_path: Path) -> None:
    for mode in ("r", "r+"):
        with pytest.raises(StoreNotFoundError, match="mode='w'"):
            store(path, mode=mode)
        assert not path.exists()
    with pytest.raises(CommitNotFoundError):
        store(path, commit="c0")
    assert not path.exists()
    store(path).close()  # "a" creates
    with pytest.raises(StoreExistsError, match="overwrite=True"):
        store(path, mode="w")
    with store(path, mode="r+") as s:
        s.upsert(keys_of(1), rows_of(keys_of(1)))
        s.commit("c0")
    with store(path, mode="w", overwrite=True) as s:
        assert len(s) == 0 and s.commits() == []
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"x")
    with pytest.raises(StoreExistsError, match="not a daskhps store"):
        store(foreign, mode="w", overwrite=True)
    with pytest.raises(StoreCorruptedError, match=r"zarr\.json"):
        store(foreign)
    assert (foreign / "cat.jpg").exists()
    with pytest.raises(ConfigError, match="mode"):
        store(path, mode="x")


def test_layout_mismatch_lists_each_field(path: Path) -> None:
    store(path, mode="w").close()
    other = dict(LAYOUT, optimizer="adagrad", dim=3)
    other.pop("dtype")
    with pytest.raises(StoreMismatchError) as info:
        store(path, layout=other)
    msg = str(info.value)
    assert "optimizer: stored 'adam', given 'adagrad'" in msg
    assert "dim: stored 2, given 3" in msg
    assert "dtype: stored 'float32', given '<absent>'" in msg
    with pytest.raises(StoreMismatchError, match="width: stored 6, given 7"):
        store(path, width=7, layout={k: v for k, v in LAYOUT.items() if k != "width"})
    store(path).close()  # the failed opens released the lock


# -- damage ----------------------------------------------------------------------------


@pytest.fixture
def two_commits(path: Path) -> Path:
    with store(path, mode="w", snapshot_every=100) as s:
        s.upsert(torch.arange(10), rows_of(torch.arange(10)))
        s.commit("c0")
        s.upsert(torch.arange(5), rows_of(torch.arange(5), 1.0))
        s.commit("c1")
    return path


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_damaged_chunk_file_is_named(two_commits: Path, damage: str) -> None:
    chunk = two_commits / "segments" / "0000000002" / "rows" / "c" / "0" / "0"
    if damage == "delete":
        chunk.unlink()
    else:
        chunk.write_bytes(chunk.read_bytes()[:7])
    with pytest.raises(StoreCorruptedError) as info:
        store(two_commits)
    assert str(chunk) in str(info.value)
    assert "earlier commit" in str(info.value) and "c0" in str(info.value)
    with store(two_commits, commit="c0") as s:  # the earlier commit does not use that segment
        assert len(s) == 10


def test_garbled_newest_manifest(two_commits: Path) -> None:
    manifest = two_commits / "commits" / "0000000002.json"
    manifest.write_text('{"name": "c1", "seq": 2, "rows": ')
    with pytest.raises(StoreCorruptedError) as info:
        store(two_commits, mode="r")
    assert str(manifest) in str(info.value) and "c0" in str(info.value)
    with store(two_commits, commit="c0") as s:
        assert len(s) == 10
        s.upsert(keys_of(99), rows_of(keys_of(99)))
        with pytest.raises(StoreCorruptedError, match="damaged"):
            s.drop_commits(keep=5)  # cannot tell what the damaged commit uses: delete nothing
        s.commit("c2")  # newer than the damaged one, so it becomes the latest
    with store(two_commits, mode="r") as s:
        assert len(s) == 11


def test_missing_metadata(two_commits: Path) -> None:
    (two_commits / "zarr.json").unlink()
    with pytest.raises(StoreCorruptedError, match=r"zarr\.json"):
        store(two_commits)
    (two_commits / "zarr.json").write_text("{not json")
    with pytest.raises(StoreCorruptedError, match=r"zarr\.json"):
        store(two_commits)


def test_unknown_commit_lists_the_available_ones(two_commits: Path) -> None:
    with pytest.raises(CommitNotFoundError) as info:
        store(two_commits, mode="r", commit="yesterday")
    assert "'c0', 'c1'" in str(info.value)


# -- zarr compatibility and the fast path ------------------------------------------------


def test_segments_are_plain_zarr_arrays(two_commits: Path) -> None:
    root = zarr.open_group(str(two_commits), mode="r")
    assert root.attrs["daskhps"]["layout"] == LAYOUT
    rows = zarr.open_array(str(two_commits / "segments" / "0000000001" / "rows"), mode="r")
    keys = zarr.open_array(str(two_commits / "segments" / "0000000001" / "keys"), mode="r")
    assert np.array_equal(keys[:], np.arange(10))
    assert np.array_equal(rows[:], rows_of(torch.arange(10)).numpy())


def test_memmap_reads_equal_zarr_python_reads(path: Path) -> None:
    rng = np.random.default_rng(0)
    with store(path, mode="w", chunk_rows=64) as s:
        for _ in range(4):
            keys = torch.from_numpy(rng.choice(5000, 700, replace=False).astype(np.int64))
            bits = rng.integers(-(2**31), 2**31, (700, W), dtype=np.int64).astype(np.int32)
            s.upsert(keys, torch.from_numpy(bits).view(torch.float32))
        s.commit("c")
        probe = torch.from_numpy(rng.integers(0, 5000, 3000).astype(np.int64))
        fast = s.lookup(probe)
        # The same rows through zarr-python, segment by segment, later segments winning.
        want = np.zeros((len(probe), W), np.int32)
        found = np.zeros(len(probe), bool)
        for seg in sorted(os.listdir(path / "segments")):
            if not seg.isdigit():
                continue
            k = zarr.open_array(str(path / "segments" / seg / "keys"), mode="r")[:]
            r = zarr.open_array(str(path / "segments" / seg / "rows"), mode="r")
            pos = {int(x): i for i, x in enumerate(k)}
            hit = [j for j, x in enumerate(probe.tolist()) if x in pos]
            want[hit] = np.asarray(r.oindex[[pos[probe[j].item()] for j in hit]]).view(np.int32)
            found[hit] = True
        assert np.array_equal(fast.found.numpy(), found)
        assert np.array_equal(fast.rows.view(torch.int32).numpy(), want)


def test_segment_recoded_by_another_tool_is_read_through_zarr(two_commits: Path) -> None:
    """A segment whose chunks are no longer raw bytes (here: gzip) takes the zarr-python path."""
    seg = two_commits / "segments" / "0000000001" / "rows"
    data = zarr.open_array(str(seg), mode="r")[:]
    zarr.create_array(
        str(seg), data=data, chunks=(4, W), compressors=zarr.codecs.GzipCodec(), overwrite=True
    )
    with store(two_commits, mode="r") as s:
        got = s.lookup(torch.arange(10))
        assert torch.equal(got.rows[5:], rows_of(torch.arange(5, 10)))
        assert torch.equal(got.rows[:5], rows_of(torch.arange(5), 1.0))


def test_stats(two_commits: Path) -> None:
    with store(two_commits) as s:
        s.lookup(keys_of(1, 2, 77))
        st_ = s.stats
        assert (st_.lookups, st_.hits, st_.rows_read) == (3, 2, 2)
        assert st_.extra["segments"] == 2
        assert st_.extra["stale_fraction"] == pytest.approx(5 / 15)
        assert st_.extra["bytes_on_disk"] > 15 * W * 4
        s.upsert(keys_of(1, 50), rows_of(keys_of(1, 50)))
        assert (s.stats.inserts, s.stats.rows_written) == (1, 2)
        assert s.name == "ads/zarr" and s.persistent and s.capacity_rows is None


def test_compaction_merges_small_segments(path: Path) -> None:
    with store(path, write_buffer_rows=0, mode="w") as s:
        for i in range(20):
            k = torch.arange(i * 3, i * 3 + 3)
            s.upsert(k, rows_of(k))
        before = state(s)
        report = s.compact(min_stale=1.0, merge_below=10)
        assert report.segments_rewritten == 20 and report.segments_deleted == 20
        assert s.stats.extra["segments"] == 1
        assert state(s) == before
        s.commit("merged")
    with store(path, mode="r") as s:
        assert state(s) == before


def test_forgotten_writer_releases_its_lock(path: Path) -> None:
    s = store(path, mode="w")
    del s
    store(path).close()


def test_store_whose_creation_never_finished_is_created_again(path: Path) -> None:
    store(path, mode="w").close()
    (path / "zarr.json").unlink()  # the root metadata is written last: a crash before it
    with store(path) as s:
        s.upsert(keys_of(1), rows_of(keys_of(1)))
        s.commit("c0")
    with store(path, mode="r") as s:
        assert len(s) == 1


# -- the open segment (write buffer) ------------------------------------------------------


def test_small_upserts_collect_in_one_open_segment(path: Path) -> None:
    with store(path, mode="w", write_buffer_rows=8) as s:
        for i in range(3):  # 6 rows: all still in memory, served from the open segment
            k = keys_of(2 * i, 2 * i + 1)
            s.upsert(k, rows_of(k))
        assert not list((path / "segments").glob("*/rows"))
        got = s.lookup(torch.arange(6))
        assert bool(got.found.all()) and torch.equal(got.rows, rows_of(torch.arange(6)))
        s.upsert(keys_of(1), rows_of(keys_of(1), salt=9.0))  # overwritten in the open segment
        assert torch.equal(s.lookup(keys_of(1)).rows, rows_of(keys_of(1), salt=9.0))
        s.upsert(keys_of(20, 21, 22), rows_of(keys_of(20, 21, 22)))  # 6 + 3 > 8: sealed first
        assert len(list((path / "segments").glob("*/rows"))) == 1
        s.commit("c0")  # seals the second
        assert len(list((path / "segments").glob("*/rows"))) == 2
    with store(path, mode="r") as s:
        assert torch.equal(s.lookup(keys_of(1)).rows, rows_of(keys_of(1), salt=9.0))
        assert torch.equal(s.lookup(keys_of(0, 22)).rows, rows_of(keys_of(0, 22)))


def test_large_upsert_after_buffered_rows_keeps_write_order(path: Path) -> None:
    with store(path, mode="w", write_buffer_rows=4) as s:
        s.upsert(keys_of(1), rows_of(keys_of(1), salt=1.0))  # buffered
        big = torch.arange(0, 10)
        s.upsert(big, rows_of(big, salt=2.0))  # direct segment: the buffer is sealed first
        s.upsert(keys_of(1), rows_of(keys_of(1), salt=3.0))  # buffered again, newest
        assert torch.equal(s.lookup(keys_of(1)).rows, rows_of(keys_of(1), salt=3.0))
        s.commit("c0")
    with store(path, mode="r") as s:  # replaying segments by id gives the same answer
        assert torch.equal(s.lookup(keys_of(1)).rows, rows_of(keys_of(1), salt=3.0))
        assert torch.equal(s.lookup(keys_of(2)).rows, rows_of(keys_of(2), salt=2.0))


def test_buffered_rows_are_lost_in_a_crash_like_any_uncommitted_write(path: Path) -> None:
    with store(path, mode="w") as s:
        s.upsert(keys_of(1), rows_of(keys_of(1)))
        s.commit("c0")
        s.upsert(keys_of(2), rows_of(keys_of(2)))  # buffered, never committed
    with store(path) as s:
        assert s.lookup(keys_of(1, 2)).found.tolist() == [True, False]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(st.sampled_from(["write", "commit", "drop", "compact"]), max_size=14))
def test_bytes_on_disk_is_the_folder_size_after_every_step(tmp_path: Path, ops: list[str]) -> None:
    """``stats`` remembers the sizes of segments and snapshots (written once) instead of
    walking every chunk file on each call; it must still equal a full walk of the folder."""
    from daskhps._paths import tree_bytes

    path = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
    with store(path, mode="w", snapshot_every=2) as s:
        for i, op in enumerate(ops):
            if op == "write":
                keys = torch.arange(i * 50, i * 50 + 300)
                s.upsert(keys, rows_of(keys, float(i)))
                s.flush()
            elif op == "commit":
                s.commit(f"c{i}")
            elif op == "drop":
                s.drop_commits(keep=1)
            else:
                s.compact(min_stale=0.1)
            assert s.stats.extra["bytes_on_disk"] == tree_bytes(path), (i, op)


def _file_pages_resident() -> int:
    """Bytes of file-backed pages mapped into this process (RssFile): memory maps' pages."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no RssFile in /proc/self/status")


def test_reading_rows_back_keeps_no_store_pages_resident(tmp_path: Path) -> None:
    """Rows read through memory maps count in the process's RSS while mapped, and Dask pauses
    a worker on RSS: a store must not keep what it read mapped. Here 100,000 rows (25 MB)
    read back in random batches would leave all of them resident."""
    n, width = 100_000, 64
    layout = {**LAYOUT, "width": width}
    s = store(tmp_path / "s", width=width, layout=layout, chunk_rows=4096, write_buffer_rows=n)
    keys = torch.arange(n, dtype=torch.int64) * 7919
    s.upsert(keys, torch.rand(n, width))
    s.commit("c")
    s.close()
    s = store(tmp_path / "s", width=width, layout=layout, chunk_rows=4096, mode="r")
    before = _file_pages_resident()
    for batch in torch.randperm(n).split(10_000):
        got = s.lookup(keys[batch])
        assert bool(got.found.all())
    grown = _file_pages_resident() - before
    assert grown < 4 * 4096 * width * 4, f"{grown / 2**20:.1f} MiB of store pages stay mapped"


def test_sparse_reads_map_rows_for_random_access(tmp_path: Path) -> None:
    """A map without MADV_RANDOM reads ahead 128 KiB around every fault, which read a store
    that had outgrown the page cache from disk many times over: rows read sparsely are mapped
    with the advice (the kernel shows it as ``rr``), dense reads without it."""
    s = store(tmp_path / "s", chunk_rows=64)
    s.upsert(keys_of(*range(100)), rows_of(keys_of(*range(100))))
    s.commit("c")
    (sid,) = s.segment_ids
    rows = s._segments[sid].rows  # the chunk files the store maps
    path = str(rows.chunk_file(0))

    def flags() -> str:
        lines = Path("/proc/self/smaps").read_text().splitlines()
        for i, line in enumerate(lines):
            if line.endswith(path):
                return next(v for v in lines[i + 1 :] if v.startswith("VmFlags:"))
        raise AssertionError("the chunk file is not mapped")

    for sparse in (True, False):
        mapped = rows.memmap(0, sparse=sparse)
        assert mapped.shape == (64, W) and mapped[3, 0] == 30.0
        assert (" rr" in flags()) == sparse, flags()
        del mapped
    # 772-byte rows (dim 64, Adam): a read-around window holds about 170 of them
    assert not read_around_pays(90_000 // 380, 65_536, 772)  # a pass's rows over 25M
    assert read_around_pays(100_000 // 30, 65_536, 772)  # 100k rows over 2M

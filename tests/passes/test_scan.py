"""The planning scan on a real cluster: one read of the log gives each partition's good rows and
writes the holdout to the workers' disks; the holdout stream routes those parts to the ranks
that evaluate them, chunk by chunk."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from daskhps.config.data import HoldoutConfig
from daskhps.data import readers
from daskhps.data.holdout import read_train_and_holdout
from daskhps.data.source import DataSource
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.passes.scan import (
    HoldoutPart,
    KeptReads,
    read_holdout_part,
    remove_spill,
    scan_log,
)
from daskhps.training.examples import RANK, worker_of_rank
from daskhps.training.holdout import HoldoutStream, chunk_parts


@given(
    rows=st.lists(st.integers(0, 50), max_size=20),
    max_rows=st.integers(1, 120),
)
def test_chunks_are_consecutive_bounded_and_greedy(rows: list[int], max_rows: int) -> None:
    parts = [HoldoutPart("w", f"p{i}", n) for i, n in enumerate(rows)]
    chunks = chunk_parts(parts, max_rows)
    flat = [p for c in chunks for p in c]
    assert flat == [p for p in parts if p.rows]  # every part with rows, once, in order
    sizes = [sum(p.rows for p in c) for c in chunks]
    for c, size in zip(chunks, sizes, strict=True):
        assert size <= max_rows or len(c) == 1  # a larger part alone
    for c, nxt in itertools.pairwise(chunks):
        assert sum(p.rows for p in c) + nxt[0].rows > max_rows  # nothing more would fit


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("scan-logs")
    generate(GeneratorConfig(rows_per_day=6000, parts_per_day=3, seed=4, vocab_scale=0.01), out)
    return out


def test_one_scan_counts_the_rows_and_writes_the_holdout_to_the_workers(
    logs: Path, tmp_path: Path
) -> None:
    from distributed import Client, LocalCluster

    source = DataSource(paths=(str(logs),))
    holdout = HoldoutConfig(fraction=0.1, seed=3)
    train, held = read_train_and_holdout(source, holdout, "pandas", block_size=200_000)
    assert held is not None and train.frame.npartitions > 3  # files read in blocks
    spill = tmp_path / "spill"
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        addresses = sorted(client.scheduler_info()["workers"])
        scan = scan_log(train, held, spill)
        want_lengths = train.frame.map_partitions(len).compute().tolist()
        want_held = held.frame.compute().reset_index(drop=True)
        assert list(scan.lengths) == want_lengths
        assert sum(scan.lengths) + scan.holdout_rows == 6000
        assert sum(scan.report.rows.values()) == 6000 and scan.report.total == 0
        assert {p.address for p in scan.holdout} <= set(addresses)
        got = pd.concat([read_holdout_part(p.path) for p in scan.holdout], ignore_index=True)
        pd.testing.assert_frame_equal(got, want_held)

        # The stream: each rank gets the rows worker_of_rank gives it, ranks ascending.
        stream = HoldoutStream(client, scan.holdout, addresses, batch_size=64, chunk_rows=250)
        assert len(stream.chunks) > 1 and stream.rows == len(want_held)
        seen = []
        for placed in stream.placed():
            frames = client.gather(placed.futures)
            for w, df in enumerate(frames):
                rank = df[RANK].to_numpy()
                assert np.all(np.diff(rank) > 0)
                assert np.all(worker_of_rank(rank, placed.rows, 64, 2) == w)
            seen.append(pd.concat(frames).sort_values(RANK).drop(columns=[RANK]))
        pd.testing.assert_frame_equal(pd.concat(seen, ignore_index=True), want_held)
        client.run(remove_spill, spill)
    assert not spill.exists()


def test_a_scan_reads_each_partition_once(
    logs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting, the bad-row report and the holdout come from the same read tasks."""
    calls: list[str] = []
    real = readers._read

    def counted(part: Any, *args: Any) -> Any:
        calls.append(part.name)
        return real(part, *args)

    monkeypatch.setattr(readers, "_read", counted)
    source = DataSource(paths=(str(logs),))
    train, held = read_train_and_holdout(source, HoldoutConfig(fraction=0.2, seed=1))
    assert held is not None
    lengths = train.frame.map_partitions(len)
    dask.compute(lengths, train.report, held.frame.map_partitions(len), scheduler="sync")
    assert sorted(calls) == sorted(train.part_names)  # each partition read once, shared


def test_a_fraction_holdout_keeps_its_rows_out_of_every_selection_of_partitions(
    logs: Path,
) -> None:
    """A pass reads some partitions of the training log, by position; each part's held-out
    rows stay held out however it is selected (Dask renumbers the partitions it selects
    below a map_partitions, which once fed part 2 the draws of part 0)."""
    from daskhps.passes.keys import select_examples

    source = DataSource(paths=(str(logs),))
    train, held = read_train_and_holdout(source, HoldoutConfig(fraction=0.3, seed=5))
    assert held is not None
    n = train.frame.npartitions
    assert n == 3
    whole_train = train.frame.compute(scheduler="sync")
    whole_held = held.frame.compute(scheduler="sync")
    lengths = train.frame.map_partitions(len).compute(scheduler="sync").tolist()
    for i in range(n):
        one = train.frame.partitions[i].compute(scheduler="sync")
        begin = sum(lengths[:i])
        want = whole_train.iloc[begin : begin + lengths[i]].reset_index(drop=True)
        pd.testing.assert_frame_equal(one.reset_index(drop=True), want)
        one_held = held.partitions(slice(i, i + 1)).frame.compute(scheduler="sync")
        held_begin = sum(
            len(held.partitions(slice(j, j + 1)).frame.compute(scheduler="sync")) for j in range(i)
        )
        want_held = whole_held.iloc[held_begin : held_begin + len(one_held)]
        pd.testing.assert_frame_equal(
            one_held.reset_index(drop=True), want_held.reset_index(drop=True)
        )
    # as a pass selects its rows: the last part's rows alone
    start = sum(lengths[:-1])
    pass_rows = select_examples(train.frame, lengths, start, sum(lengths)).compute(scheduler="sync")
    tail = whole_train.iloc[start:].reset_index(drop=True)
    pd.testing.assert_frame_equal(pass_rows.reset_index(drop=True), tail)
    assert len(whole_train) + len(whole_held) == 6000


@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=12),
    start=st.integers(0, 200),
    size=st.integers(1, 200),
)
def test_kept_reads_keep_exactly_the_partitions_overlapping_the_window(
    lengths: list[int], start: int, size: int
) -> None:
    kept = KeptReads({i: object() for i in range(len(lengths))})
    kept.keep_only(lengths, start, start + size)
    positions = np.repeat(np.arange(len(lengths)), lengths)  # partition of each plan position
    want = sorted({int(p) for p in positions[start : start + size]})
    assert list(kept.partitions) == want
    kept.release()
    assert kept.partitions == ()


def test_a_scan_keeps_the_first_pass_parsed_and_the_pass_reads_none_of_it(
    logs: Path, tmp_path: Path
) -> None:
    """The partitions a keep window overlaps stay in the workers' memory: a pass over them reads
    no file again, a pass beyond them reads its own; the counts are the unkept scan's (with a
    fraction holdout, whose rows the reads still hold)."""
    from distributed import Client, LocalCluster, get_task_stream

    from daskhps.passes.keys import pass_partitions

    source = DataSource(paths=(str(logs),))
    train, held = read_train_and_holdout(
        source, HoldoutConfig(fraction=0.1, seed=3), "pandas", block_size=200_000
    )
    assert held is not None and train.frame.npartitions >= 6
    names = {r.key: name for r, name in zip(train.reads, train.part_names, strict=True)}

    def read(tasks: list[dict[str, Any]]) -> list[str]:
        """The parts whose read tasks ran (a task stream's records)."""
        return sorted(names[t["key"]] for t in tasks if t["key"] in names)

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster),
    ):
        plain = scan_log(train, held, tmp_path / "plain")
        assert plain.kept.partitions == ()
        lengths = list(plain.lengths)
        window = (lengths[0] + 1, sum(lengths[:3]) + 1)  # part of 1, all of 2, one row of 3
        with get_task_stream() as stream:
            scan = scan_log(train, held, tmp_path / "kept", keep=window)
        assert read(stream.data) == sorted(train.part_names)  # the scan reads each once
        assert list(scan.lengths) == lengths and scan.report == plain.report
        assert scan.holdout_rows == plain.holdout_rows
        assert scan.kept.partitions == (1, 2, 3)

        def read_pass(start: int, stop: int) -> list[str]:
            where, _, _ = pass_partitions(lengths, start, stop)
            with get_task_stream() as stream:
                train.partitions(where).frame.persist().compute()
            return read(stream.data)

        assert read_pass(*window) == []  # the kept partitions serve the pass
        assert read_pass(0, window[1]) == [train.part_names[0]]  # partition 0 was let go
        scan.kept.release()
        assert read_pass(*window) == sorted(train.part_names[1:4])

"""Large plain-text files read in byte ranges: the same rows, in the same order, with the same
line numbers in messages, as the file read whole."""

from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.data import Schema, read_click_log
from daskhps.data.readers import split_parts
from daskhps.data.textfile import read_text_bytes
from daskhps.errors import DataError

SCHEMA = Schema.from_dict(
    {
        "name": "mini",
        "columns": ["label", "I1", "C1", "C2"],
        "label": "label",
        "dense": ["I1"],
        "categorical": ["C1", "C2"],
    }
)


def _lines(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        f"{rng.integers(2)}\t{rng.integers(100)}\t{'x' * int(rng.integers(0, 9))}\t{i:x}"
        for i in range(n)
    ]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(st.text(alphabet="ab\t\r", max_size=12), max_size=30),
    block=st.integers(1, 40),
    final_newline=st.booleans(),
)
def test_ranges_hold_every_line_once_in_order(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], block: int, final_newline: bool
) -> None:
    path = tmp_path_factory.mktemp("ranges") / "f.tsv"
    data = "\n".join(lines) + ("\n" if final_newline and lines else "")
    path.write_text(data)
    size = path.stat().st_size
    got = b"".join(
        read_text_bytes(str(path), (a, min(a + block, size))).data.to_pybytes()
        for a in range(0, size, block)
    )
    assert got == data.encode()


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(st.text(alphabet="ab\t\r", max_size=12), max_size=30),
    block=st.integers(1, 40),
    chunk=st.integers(1, 16),
)
def test_a_range_of_an_object_is_the_range_of_the_file(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], block: int, chunk: int
) -> None:
    """An object's range comes from ranged reads that grow by ``chunk`` bytes until the
    lines' ends are found (a line longer than a chunk included): each range holds the bytes
    the same range of the file holds."""
    import fsspec

    from daskhps.data import textfile

    path = tmp_path_factory.mktemp("object-ranges") / "f.tsv"
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(data)
    url = f"memory://object-ranges/{path.parent.name}/f.tsv"
    fsspec.filesystem("memory").pipe_file(url, data)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(textfile, "_CHUNK", chunk)
        for a in range(0, len(data), block):
            r = (a, min(a + block, len(data)))
            want = read_text_bytes(str(path), r).data.to_pybytes()
            assert read_text_bytes(url, r).data.to_pybytes() == want, r
    fsspec.filesystem("memory").rm_file(url)


@pytest.mark.parametrize("block", [64 << 10, 100_000, 300_000])
def test_blocks_read_the_same_rows_as_the_whole_file(tmp_path: Path, block: int) -> None:
    path = _write(tmp_path / "big.tsv", _lines(60_000))
    whole = read_click_log([str(path)], SCHEMA)
    blocks = read_click_log([str(path)], SCHEMA, block_size=block)
    expected_parts = -(-path.stat().st_size // block)
    assert whole.frame.npartitions == 1
    assert blocks.frame.npartitions == expected_parts > 1
    a, b = dask.compute(whole.frame, blocks.frame, scheduler="sync")
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    report = blocks.compute_report()
    assert report.rows == {str(path): 60_000} and report.total == 0


def test_only_plain_text_is_split(tmp_path: Path) -> None:
    plain = _write(tmp_path / "a.tsv", _lines(5000))
    gz = tmp_path / "b.tsv.gz"
    gz.write_bytes(b"")  # never opened: compressed files are read whole
    small = _write(tmp_path / "c.tsv", _lines(10))
    parts = split_parts([str(plain), str(gz), str(small)], 16 << 10, SCHEMA)
    assert [p.path for p in parts].count(str(plain)) == -(-plain.stat().st_size // (16 << 10))
    assert [p.byte_range for p in parts if p.path != str(plain)] == [None, None]
    assert split_parts([str(plain)], None, SCHEMA)[0].byte_range is None
    # The fingerprint of a plan over whole files keeps its names (the paths themselves).
    assert [p.name for p in split_parts([str(small)], 16 << 10, SCHEMA)] == [str(small)]


def test_a_bad_line_in_a_later_block_names_its_line_in_the_file(tmp_path: Path) -> None:
    lines = _lines(20_000)
    lines[15_000] = "1\tnot-a-number\tx\ty"
    path = _write(tmp_path / "big.tsv", lines)
    log = read_click_log([str(path)], SCHEMA, bad_rows="fail", block_size=64 << 10)
    assert log.frame.npartitions > 3
    with pytest.raises(DataError, match=r"big\.tsv: line 15001: dense column I1"):
        log.frame.compute(scheduler="sync")


def test_a_header_is_read_from_the_first_block_only(tmp_path: Path) -> None:
    d = {k: v for k, v in SCHEMA.to_dict().items() if k != "columns"}
    schema = Schema.from_dict({**d, "header": True})
    lines = ["label\tI1\tC1\tC2", *_lines(20_000)]
    path = _write(tmp_path / "h.tsv", lines)
    whole = read_click_log([str(path)], schema).frame.compute(scheduler="sync")
    blocks = read_click_log([str(path)], schema, block_size=64 << 10)
    assert blocks.frame.npartitions > 2
    got = blocks.frame.compute(scheduler="sync")
    assert len(got) == 20_000
    pd.testing.assert_frame_equal(whole.reset_index(drop=True), got.reset_index(drop=True))


def test_a_line_longer_than_a_block_leaves_empty_blocks(tmp_path: Path) -> None:
    long = "1\t2\t" + "x" * 300_000 + "\ty"
    path = _write(tmp_path / "long.tsv", [*_lines(10), long, *_lines(10, seed=1)])
    log = read_click_log([str(path)], SCHEMA, block_size=64 << 10)
    lengths = log.frame.map_partitions(len).compute(scheduler="sync").tolist()
    assert sum(lengths) == 21 and 0 in lengths
    assert log.compute_report().total == 0  # an empty block is not an empty shard

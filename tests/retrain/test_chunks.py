"""Which chunks of a log being written a follower may take, and which it already took."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daskhps.data.source import SUCCESS
from daskhps.errors import DataError
from daskhps.retrain.chunks import Chunk, list_chunks, new_chunks


def _write(path: Path, text: str = "0\t1\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_marked_folder_is_one_chunk_and_a_loose_file_its_own(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    hour7 = logs / "day=2024-01-05" / "hour=07"
    a, b = _write(hour7 / "part-0.tsv"), _write(hour7 / "part-1.tsv")
    _write(hour7 / SUCCESS, "")
    waiting = _write(logs / "day=2024-01-05" / "hour=08" / "part-0.tsv")
    loose = _write(logs / "incoming" / "part-17.tsv")
    _write(logs / "incoming" / ".part-18.tsv.tmp")  # being written, then renamed
    _write(logs / "incoming" / "_part-19.tsv")
    _write(logs / "_temporary" / "0" / "part-20.tsv")  # Spark's work in progress
    _write(logs / ".staging" / "part-21.tsv")

    chunks = list_chunks([str(logs)])
    assert chunks == sorted(chunks, key=lambda c: c.name)
    assert Chunk(str(hour7), (str(a), str(b))) in chunks
    assert Chunk(str(waiting), (str(waiting),)) in chunks  # no marker: the file is done
    assert Chunk(str(loose), (str(loose),)) in chunks
    assert len(chunks) == 3
    assert chunks[0].day == "2024-01-05" and Chunk(str(loose), ()).day is None
    # with require_complete a file waits for its folder's marker
    assert [c.name for c in list_chunks([str(logs)], require_complete=True)] == [str(hour7)]


def test_a_folder_marked_after_some_files_were_taken_adds_only_the_rest(tmp_path: Path) -> None:
    day = tmp_path / "logs" / "day=2024-01-06"
    first = _write(day / "part-0.tsv")
    taken = {f for c in list_chunks([str(tmp_path / "logs")]) for f in c.files}
    assert taken == {str(first)}
    second = _write(day / "part-1.tsv")
    _write(day / SUCCESS, "")
    fresh = new_chunks(list_chunks([str(tmp_path / "logs")]), taken)
    assert fresh == [Chunk(str(day), (str(second),))]


def test_no_data_yet_is_no_chunk_and_a_missing_folder_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert list_chunks([str(tmp_path / "empty")]) == []
    with pytest.raises(DataError, match=r"nope does not exist; check data.train.paths"):
        list_chunks([str(tmp_path / "nope")])


_names = st.lists(st.sampled_from([f"f{i}" for i in range(8)]), max_size=5, unique=True)


@given(st.lists(_names, max_size=6), st.sets(st.sampled_from([f"f{i}" for i in range(8)])))
def test_new_chunks_is_the_model(files_per_chunk: list[list[str]], taken: set[str]) -> None:
    """Each chunk keeps its files that were not taken, in order; empty ones go."""
    chunks = [Chunk(f"c{i}", tuple(files)) for i, files in enumerate(files_per_chunk)]
    got = new_chunks(chunks, taken)
    want = [
        (c.name, [f for f in c.files if f not in taken])
        for c in chunks
        if any(f not in taken for f in c.files)
    ]
    assert [(c.name, list(c.files)) for c in got] == want
    assert not {f for c in got for f in c.files} & taken

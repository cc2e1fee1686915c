"""The counts in daskhps's messages (daskhps/_text.py)."""

from __future__ import annotations

from daskhps._text import counted


def test_a_count_of_one_is_singular_and_any_other_plural() -> None:
    assert counted(1, "file") == "1 file"
    assert [counted(n, "worker") for n in (0, 2)] == ["0 workers", "2 workers"]
    assert counted(1234, "row") == "1,234 rows"
    assert counted(1, "batch", "batches") == "1 batch"
    assert counted(3, "batch", "batches") == "3 batches"

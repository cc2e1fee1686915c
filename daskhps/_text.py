"""Counts in what daskhps prints: ``counted(1, "file")`` is "1 file", never "1 files"."""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` (thousands separated) and ``noun``, plural unless ``n`` is 1: ``plural``, by
    default ``noun`` and an "s" ("1 file", "2 files", "1,024 rows", "0 batches" with
    ``plural="batches"``)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"

"""Tiny generated click logs for tests that train end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from daskhps.data.synthetic import GeneratorConfig, generate


def generated_logs(
    factory: pytest.TempPathFactory,
    *,
    days: int,
    rows_per_day: int,
    parts_per_day: int,
    seed: int,
    name: str = "logs",
) -> Path:
    """A fresh folder of ``days`` day partitions of synthetic logs with small vocabularies."""
    out = factory.mktemp(name)
    generate(
        GeneratorConfig(
            days=days,
            rows_per_day=rows_per_day,
            parts_per_day=parts_per_day,
            seed=seed,
            vocab_scale=0.01,
        ),
        str(out),
    )
    return out

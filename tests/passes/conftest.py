"""A small generated Criteo-format log shared by the pass tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from daskhps.data import ClickLog, read_click_log
from daskhps.data.synthetic import GeneratorConfig, generate


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("logs")
    generate(
        GeneratorConfig(days=2, rows_per_day=6000, parts_per_day=3, seed=5, vocab_scale=0.01),
        out,
    )
    return out


@pytest.fixture(scope="session")
def click_log(log_dir: Path) -> ClickLog:
    return read_click_log(str(log_dir)).persist()

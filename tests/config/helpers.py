"""Helpers for config tests: write a YAML file, load it, expect a precise error."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from daskhps.config import RunConfig, load_config
from daskhps.errors import ConfigError

MINIMAL = "data:\n  generate: {}\n"


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load(tmp_path: Path, text: str, *overrides: str) -> RunConfig:
    return load_config(write(tmp_path, text), overrides)


def error(tmp_path: Path, text: str, *overrides: str) -> str:
    """The message of the ConfigError that loading ``text`` raises."""
    with pytest.raises(ConfigError) as e:
        load(tmp_path, text, *overrides)
    return str(e.value)


def located(msg: str, path: Path, key: str, line: int | None = None) -> bool:
    """``msg`` starts with ``path[:line]: key:``."""
    where = re.escape(str(path)) + (f":{line}" if line else r"(:\d+)?")
    return re.match(rf"^{where}: {re.escape(key)}: ", msg) is not None

"""Worker-side helpers of the pause tests: numpy only, so that importing them on a worker does
not add torch's hundreds of MiB to the memory the tests push over Dask's pause line."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import psutil

_held: list[Any] = []  # what keeps the worker over its pause line


def hold(target_bytes: int) -> int:
    """Allocate (and touch) what brings this process's memory to ``target_bytes``; returns
    the bytes added. Held in a global, out of Dask's reach (it cannot spill it)."""
    add = max(0, target_bytes - psutil.Process().memory_info().rss)
    _held.append(np.ones(add // 8, dtype=np.float64))
    return add


def let_go() -> None:
    _held.clear()
    gc.collect()


def echo(value: object) -> object:
    return value

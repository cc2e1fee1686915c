"""A pass's owner partition (a frame with ``key``, ``count`` and ``day`` columns), or an array
of keys, as the tensors the shards take."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["column_of", "keys_of"]


def keys_of(part: Any) -> torch.Tensor:
    """int64 keys of a pass's owner partition (a frame with a ``key`` column) or of an array."""
    if hasattr(part, "columns"):
        return column_of(part, "key", torch.int64)
    return _tensor(part, torch.int64)


def column_of(part: Any, column: str, dtype: torch.dtype) -> torch.Tensor:
    """One column of a pass's owner partition as a tensor of ``dtype``."""
    return _tensor(part[column].to_numpy(), dtype)


def _tensor(raw: Any, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(raw, np.ndarray) and not raw.flags.writeable:
        raw = raw.copy()  # a read-only pandas view: torch must not alias it
    return torch.as_tensor(raw).to(dtype)

"""Owner routing: ``owner = mix(key) % num_shards``; virtual shards are assigned to workers.

The same ``mix`` runs on numpy/pandas (the pass shuffle), torch int64 tensors (the training
loop's per-mini-batch routing) and cupy/cudf, and gives identical owners on all of them: the
shuffle and the training loop must agree on where every key lives. This module imports neither
dask nor torch at import time.

``mix(key) = fmix64(key XOR SHARD_SALT) & (2**63 - 1)``: keys are already hashes, but
re-mixing with a salt decorrelates shard choice from the low bits that tiers use for their own
hash buckets (otherwise every key of a shard would fall into the same bucket residue).

::

    key ---mix---> m ---% num_shards---> virtual shard s ---shard map---> worker w
                                         0 1 2 3 | 4 5 6 7        (8 shards, 2 workers:
                                         worker 0 | worker 1       contiguous blocks)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from daskhps._mix64 import MASK63, fmix64_numpy, fmix64_torch_, s64
from daskhps.errors import ConfigError

__all__ = ["SHARD_SALT", "ShardMap", "assign_shards", "mix", "shard_of"]

SHARD_SALT = 0x5348415244534C54  # "SHARDSLT"


def _mix_numpy(keys: np.ndarray, xp: Any = np) -> Any:
    # No copy for int64 keys: the XOR below makes the fresh array the finaliser works on.
    z = xp.asarray(keys).astype(xp.int64, copy=False).view(xp.uint64) ^ xp.uint64(SHARD_SALT)
    z = fmix64_numpy(z, xp)
    z &= xp.uint64(MASK63)
    return z.view(xp.int64)


def _mix_torch(keys: Any) -> Any:
    """The same arithmetic on int64 tensors (``keys ^ salt`` is a fresh tensor, so the
    finaliser and the mask run in place on it)."""
    import torch

    z = keys.to(torch.int64) ^ s64(SHARD_SALT)
    return fmix64_torch_(z).bitwise_and_(MASK63)


def mix(keys: Any) -> Any:
    """Non-negative int64 mix of int64 keys (numpy, pandas, torch or cupy/cudf)."""
    mod = type(keys).__module__.split(".")[0]
    if mod == "torch":
        return _mix_torch(keys)
    if mod == "pandas":
        import pandas as pd

        return pd.Series(_mix_numpy(keys.to_numpy()), index=keys.index, name=keys.name)
    if mod == "cudf":
        import cudf
        import cupy

        return cudf.Series(_mix_numpy(keys.values, cupy), index=keys.index, name=keys.name)
    if mod == "cupy":
        import cupy

        return _mix_numpy(keys, cupy)
    return _mix_numpy(np.asarray(keys))


def shard_of(keys: Any, num_shards: int) -> Any:
    """Virtual shard of each key: ``mix(key) % num_shards`` (same container type back)."""
    if num_shards < 1:
        raise ConfigError(f"num_shards must be >= 1, got {num_shards}")
    return mix(keys) % num_shards


def assign_shards(num_shards: int, num_workers: int) -> np.ndarray:
    """Worker of each virtual shard: contiguous, balanced blocks (sizes differ by <= 1)."""
    if num_workers < 1 or num_shards < num_workers:
        raise ConfigError(
            f"num_shards ({num_shards}) must be >= num_workers ({num_workers}) >= 1; "
            "raise num_shards (it is fixed per table, so choose it for the largest cluster)"
        )
    return (np.arange(num_shards, dtype=np.int64) * num_workers) // num_shards


@dataclass(frozen=True)
class ShardMap:
    """Virtual shards of one table and the worker (rank) that owns each."""

    num_shards: int
    num_workers: int

    def __post_init__(self) -> None:
        assign_shards(self.num_shards, self.num_workers)  # validates

    @property
    def worker_of_shard(self) -> np.ndarray:
        return assign_shards(self.num_shards, self.num_workers)

    def shards_of(self, worker: int) -> np.ndarray:
        return np.flatnonzero(self.worker_of_shard == worker)

    def shard(self, keys: Any) -> Any:
        return shard_of(keys, self.num_shards)

    def worker(self, keys: Any) -> Any:
        """Owner worker of each key, as the same container type (torch stays torch)."""
        s = shard_of(keys, self.num_shards)
        # Contiguous blocks: worker = shard * W // S, computed without a lookup table so it
        # is the same expression on every array library.
        return (s * self.num_workers) // self.num_shards

"""Parsed rows as the model reads them: dense values and keys, cut into batches.

::

    Inputs   dense    float32[n, D]   C-contiguous, as the trainer's examples hold it
             keys     int64[n, F]     single-hot schemas: one key a field
                      int64[N]        multi-hot: CSR bags, example-major, with
             offsets  int64[n*F + 1]  (no bag is empty: daskhps.training.examples.bag_keys)

What :class:`~daskhps.training.examples.WorkerExamples` builds from a parsed frame, without
the frame's copy it makes for its rank column: :meth:`Inputs.from_frame` gives the same
tensors, so a batch scores bit for bit as the trainer's evaluation scores it. An online
request's JSON rows become :class:`Inputs` without any frame (daskhps.serve.requests).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from daskhps.data.schema import Schema
from daskhps.training.examples import bag_keys

__all__ = ["Inputs"]


def _tensor(a: np.ndarray) -> torch.Tensor:
    # As the trainer's examples: a read-only array (pandas' copy-on-write views) is copied,
    # in C order (ndarray.copy), which decides the dense batch's layout and so its bits.
    return torch.from_numpy(a if a.flags.writeable else a.copy())


@dataclass(frozen=True)
class Inputs:
    """The model's inputs of ``n`` parsed rows (see the module docstring)."""

    dense: torch.Tensor
    keys: torch.Tensor
    offsets: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.dense.shape[0])

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, schema: Schema) -> Inputs:
        """The inputs of a parsed frame (daskhps.data.parse), as the trainer builds them."""
        n = len(frame)
        dense_cols = list(schema.dense_names)
        dense = (
            _tensor(frame[dense_cols].to_numpy(dtype=np.float32))
            if dense_cols
            else torch.zeros(n, 0)
        )
        if any(f.multi_hot for f in schema.categorical):
            flat, offs = bag_keys(frame, schema)
            return cls(dense, _tensor(flat), _tensor(offs))
        cats = list(schema.categorical_names)
        return cls(dense, _tensor(np.ascontiguousarray(frame[cats].to_numpy(dtype=np.int64))))

    def batch(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(dense, keys, offsets)`` of rows ``lo:hi`` (offsets from 0)."""
        if self.offsets is None:
            return self.dense[lo:hi], self.keys[lo:hi], None
        nf = (len(self.offsets) - 1) // max(1, len(self))
        offs = self.offsets[lo * nf : hi * nf + 1]
        first = offs[0]
        return self.dense[lo:hi], self.keys[int(first) : int(offs[-1])], offs - first

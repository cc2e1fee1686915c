"""Zero arrays whose memory costs nothing until written: every array of the in-memory tiers."""

from __future__ import annotations

import mmap

import numpy as np
import torch

__all__ = ["reserve_zeros"]

_RESERVE_MIN = 1 << 20  # bytes from which a CPU array is mapped rather than allocated


def reserve_zeros(
    *shape: int, dtype: torch.dtype, device: torch.device, pin_memory: bool = False
) -> torch.Tensor:
    """A zero tensor whose memory costs nothing until written.

    ``torch.zeros`` writes every byte at once: a tier sized to a fraction of the worker's
    memory limit would fault in (and zero) all of it when the table opens, gigabytes the
    table may never fill. On the CPU a large array is mapped anonymously instead: the kernel
    supplies zero pages as they are first written. GPU and page-locked memory are allocated
    as before.
    """
    nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or pin_memory or nbytes < _RESERVE_MIN:
        return torch.zeros(*shape, dtype=dtype, device=device, pin_memory=pin_memory)
    buf = mmap.mmap(-1, nbytes)
    # numpy's array keeps the mapping alive; torch's tensor keeps the array alive.
    np_dtype = torch.empty((), dtype=dtype).numpy().dtype
    return torch.from_numpy(np.frombuffer(buf, dtype=np_dtype).reshape(shape))

"""Whether this machine can run a CUDA cluster: asked by the cluster's start, the checks
before a run, and the fork server (which must not import the distributed layer it serves)."""

from __future__ import annotations

__all__ = ["cuda_available"]


def cuda_available() -> bool:
    """Whether ``dask_cuda`` imports and torch sees a CUDA device."""
    try:
        import dask_cuda  # noqa: F401
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())

"""Whether this machine can run a CUDA cluster: asked by the cluster's start, the checks
before a run, and the fork server (which must not import the distributed layer it serves)."""

from __future__ import annotations

from typing import Literal

__all__ = ["cuda_available", "cuda_cluster", "cuda_missing"]


def cuda_available() -> bool:
    """Whether ``dask_cuda`` imports and torch sees a CUDA device."""
    try:
        import dask_cuda  # noqa: F401
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def cuda_cluster(gpu: bool | Literal["auto"]) -> bool:
    """Whether an embedded cluster asked for ``gpu`` (``cluster.gpu``) has CUDA workers:
    ``True`` has, ``"auto"`` where this machine can run them."""
    return gpu is True or (gpu == "auto" and cuda_available())


def cuda_missing(gpu: bool | Literal["auto"]) -> bool:
    """Whether ``gpu`` asks for CUDA workers this machine cannot run."""
    return gpu is True and not cuda_available()

"""Errors of the distributed layer (all :class:`~daskhps.errors.DaskHPSError`)."""

from __future__ import annotations

from daskhps.errors import DaskHPSError

__all__ = ["ClusterError", "CommError", "WorkerLostError", "required_rank"]


class ClusterError(DaskHPSError, RuntimeError):
    """A cluster could not be started, reached, or does not have what the run asks for."""


class CommError(DaskHPSError, RuntimeError):
    """A torch.distributed group could not be formed, or one of its collectives failed."""


class WorkerLostError(CommError):
    """A rank's Dask worker left the cluster (died, was killed or restarted) during a run."""


def required_rank(rank: int | None) -> int:
    """``rank``; a :class:`ClusterError` where this worker has none (not one of the run's)."""
    if rank is None:
        raise ClusterError(
            "this worker is not one of the run's ranks; pin the run's tasks to the "
            "addresses the run was started with"
        )
    return rank

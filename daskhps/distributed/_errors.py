"""Errors of the distributed layer (all :class:`~daskhps.errors.DaskHPSError`)."""

from __future__ import annotations

from daskhps.errors import DaskHPSError

__all__ = [
    "ClusterError",
    "CommError",
    "WaitStopped",
    "WorkerLostError",
    "WorkerPausedError",
    "required_rank",
]


class ClusterError(DaskHPSError, RuntimeError):
    """A cluster could not be started, reached, or does not have what the run asks for."""


class CommError(DaskHPSError, RuntimeError):
    """A torch.distributed group could not be formed, or one of its collectives failed."""


class WorkerLostError(CommError):
    """A rank's Dask worker left the cluster (died, was killed or restarted) during a run."""


class WorkerPausedError(ClusterError):
    """A rank's Dask worker stayed paused for memory: its tasks cannot start. Not a
    :class:`CommError`: a restart would meet the same memory, so it is not retried."""


class WaitStopped(ClusterError):
    """A wait on pinned tasks was told to stop (the run is closing: Ctrl-C or a failure)."""


def required_rank(rank: int | None) -> int:
    """``rank``; a :class:`ClusterError` where this worker has none (not one of the run's)."""
    if rank is None:
        raise ClusterError(
            "this worker is not one of the run's ranks; pin the run's tasks to the "
            "addresses the run was started with"
        )
    return rank

"""Errors of scheduled retraining (all :class:`~daskhps.errors.DaskHPSError`)."""

from __future__ import annotations

from daskhps.errors import DaskHPSError

__all__ = ["RegistryError", "RetrainLockedError", "UnknownVersionError", "VersionNotFoundError"]


class RegistryError(DaskHPSError, OSError):
    """The version registry (``registry.json``, ``CURRENT``) is unreadable or inconsistent."""


class VersionNotFoundError(DaskHPSError, KeyError):
    """A named version is not in the registry, or its checkpoint or commit is gone."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class UnknownVersionError(VersionNotFoundError):
    """The version a command line named was never published, or retention removed it: a bad
    argument (exit 2), where a published version whose files are gone is damage (exit 1)."""


class RetrainLockedError(DaskHPSError, BlockingIOError):
    """Another retraining run (or rollback) of the same run directory holds the lock."""

"""The exceptions daskhps raises.

Every error derives from :class:`DaskHPSError`; each subclass also derives from the built-in
exception it resembles, so ``except KeyError`` or ``except FileNotFoundError`` keep working.
Messages name the table, tier, file or key involved and say what would fix the problem.
"""

from __future__ import annotations

__all__ = [
    "CapacityError",
    "CheckpointError",
    "CommitNotFoundError",
    "ConfigError",
    "ConfigKeyError",
    "DaskHPSError",
    "DataError",
    "ResumeError",
    "RunExistsError",
    "StorageError",
    "StoreCorruptedError",
    "StoreExistsError",
    "StoreLockedError",
    "StoreMismatchError",
    "StoreNotFoundError",
    "StoreReadOnlyError",
    "UnwritablePathError",
]


class DaskHPSError(Exception):
    """Root of every error raised by daskhps."""


class ConfigError(DaskHPSError, ValueError):
    """A configuration value is missing, of the wrong type, or impossible."""


class ConfigKeyError(ConfigError):
    """A ConfigError about one key of a section that a component checks itself (a model's
    options against its class): ``key`` is dotted under the section ('' for the section), so a
    run config's loader can say the file's line without reading the message back."""

    def __init__(self, origin: str, key: str = "", reason: str | None = None) -> None:
        # One argument is a plain message (how errors are rebuilt after a trip to a worker).
        text = origin if reason is None else f"{origin}{'.' + key if key else ''}: {reason}"
        super().__init__(text)
        self.origin, self.key, self.reason = origin, key, reason if reason is not None else text

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return (type(self), (self.origin, self.key, self.reason))


class DataError(DaskHPSError, ValueError):
    """Input data (keys, rows, gradients, click-log rows) has the wrong type, shape or content."""


class CapacityError(DaskHPSError, ValueError):
    """A working set does not fit the tier that must hold it.

    Not a ``MemoryError``: a ``MemoryError`` subclass cannot be rebuilt after travelling from
    a Dask worker to the client, and these errors are raised on workers.
    """


class CheckpointError(DaskHPSError, OSError):
    """A checkpoint is missing, incomplete, damaged, or could not be written."""


class ResumeError(DaskHPSError, ValueError):
    """A run cannot resume: no checkpoint, or its config changed in a way resume refuses."""


class RunExistsError(DaskHPSError, FileExistsError):
    """A run directory already holds a run that the requested job would remove or rewrite."""


class StoreNotFoundError(DaskHPSError, FileNotFoundError):
    """A persistent store does not exist where it was expected."""


class CommitNotFoundError(DaskHPSError, KeyError):
    """A named commit point does not exist in a store."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class StoreCorruptedError(DaskHPSError, OSError):
    """A persistent store is damaged: metadata or segment files are missing or unreadable."""


class StoreMismatchError(DaskHPSError, ValueError):
    """A store was opened with a layout (dim, optimizer, width) other than the one it holds."""


class StoreLockedError(DaskHPSError, BlockingIOError):
    """Another writer holds the store's lock."""


class StoreExistsError(DaskHPSError, FileExistsError):
    """A store (or other data) already exists where a new store was to be created."""


class StoreReadOnlyError(DaskHPSError, PermissionError):
    """A write was attempted on a store opened read-only (or already closed)."""


class StorageError(DaskHPSError, OSError):
    """Object storage (or another fsspec store) failed: no such bucket, access denied, no
    connection, an object gone, a protocol whose package is not installed."""


class UnwritablePathError(DaskHPSError, OSError):
    """A folder that daskhps must write to (a run, the stores, an output) cannot be created
    or written."""


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, or its type's name when it has none: what a
    one-line report says of a cause."""
    text = str(error)
    return text.splitlines()[0] if text else type(error).__name__

"""Where a checkpoint's rows are read from on this machine: its own stores, or its copy.

In a run on several machines each rank's store lies on its worker's local disk
(``table.tiers.store_dir``); only ``run.dir`` and the copy at ``checkpoint.replicate_to`` are
shared. ``daskhps inspect``, ``predict``, ``export`` and ``serve`` ask :func:`stores_here`::

    own stores   every rank store is at its path here and holds the commit the checkpoint
                 recorded (CommitId: seq, time, rows; any commit of that name in a checkpoint
                 made before they were recorded)
    its copy     otherwise: the checkpoint's copy at checkpoint.replicate_to (a folder, or a
                 URL read through the local cache of daskhps.runfiles.copycache), when it is
                 complete, of the same files, and its stores sound
    nowhere      otherwise: one line (StoreNotFoundError) saying where the stores are and
                 what to give: checkpoint.replicate_to, or a machine that holds the stores

A store at the path whose commit is another one (a stale copy, another run's store, a name
committed again) holds other rows and is never read for this checkpoint. The checkpoint's own
stores damaged (there, at the recorded commit, a file missing or short) are damage: ``inspect``
reports it; the readers of a model read the copy instead when it is sound, else fail naming
the file. Nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from daskhps.errors import CheckpointError, StorageError, StoreNotFoundError
from daskhps.runfiles.checkpoint import Checkpoint
from daskhps.runfiles.replica import KEY, Replica
from daskhps.tiers.store.check import CommitId, StoreCheck, StoreChecker

__all__ = ["Reading", "stores_here"]

_ELSEWHERE = "run this on a machine that holds the stores"


@dataclass(frozen=True)
class Reading:
    """Where :attr:`checkpoint`'s rows are read from here.

    Attributes
    ----------
    checkpoint:
        The checkpoint asked about.
    stores:
        The checkpoint whose stores are read: :attr:`checkpoint` itself, or its copy; None
        when neither can be (:attr:`refusal` says why).
    checks:
        Per table (name), per rank, what checking the stores read found (their damage,
        segments, ...).
    why:
        Why the checkpoint's own stores are not read, or are damaged; None when they are
        read and sound.
    refusal:
        When no stores are read: the one line that says where they are and what to give.
    """

    checkpoint: Checkpoint
    stores: Checkpoint | None
    checks: dict[str, tuple[StoreCheck, ...]]
    why: str | None = None
    refusal: str | None = None

    @property
    def from_copy(self) -> bool:
        return self.stores is not None and self.stores is not self.checkpoint

    @property
    def note(self) -> str | None:
        """One line when the rows are read from the copy: which, and why."""
        if self.stores is None or not self.from_copy:
            return None
        return f"read from the copy at {self.stores.path}: {self.why}"

    def require(self) -> Checkpoint:
        """The checkpoint whose stores are read; raises :class:`StoreNotFoundError` (one
        line) when there is none here."""
        if self.stores is None:
            raise StoreNotFoundError(self.refusal)
        return self.stores


def stores_here(
    ckpt: Checkpoint, checker: StoreChecker | None = None, *, avoid_damage: bool = True
) -> Reading:
    """Where ``ckpt``'s rows are read from on this machine (see the module docstring).

    ``checker`` checks the stores (default: sizes only; with ``verify``, sha256 too).
    ``avoid_damage``: read the copy, when sound, instead of own stores that are damaged (what
    predict, export and serve do); False keeps them, their damage reported (inspect).
    """
    checker = checker or StoreChecker()
    own = _check_all(ckpt, checker)
    away = [
        (c, rec)
        for table, checks in own.items()
        for c, rec in zip(checks, ckpt.recorded_commits(table), strict=True)
        if not _holds(c, rec)
    ]
    if not away and (all(c.ok for cs in own.values() for c in cs) or not avoid_damage):
        return Reading(ckpt, ckpt, own)
    why = _away(ckpt, *away[0]) if away else f"its stores here are damaged ({_first_damage(own)})"
    trouble = None  # what is wrong with the copy; None: it is sound, or there is none
    try:
        copy = _copy(ckpt, checker)
    except _Unusable as e:
        copy, trouble = None, str(e)
    if copy is not None and any(not c.ok for cs in copy[1].values() for c in cs):
        trouble = f"its copy at {copy[0].path} is damaged too ({_first_damage(copy[1])})"
    if copy is not None and (trouble is None or (away and not avoid_damage)):
        return Reading(ckpt, copy[0], copy[1], why)
    if not away:
        return Reading(ckpt, ckpt, own, why)  # damaged, and the copy cannot help
    if trouble is None:  # the run has no copy
        advice = f"set {KEY} for the run (its checkpoints are copied there, and read from there)"
        advice += f", or {_ELSEWHERE}"
    else:
        advice = f"{trouble}; {_ELSEWHERE}"
    refusal = f"checkpoint {ckpt.path} reads stores that are {why}; {advice}"
    return Reading(ckpt, None, {}, why, refusal)


def _check_all(ckpt: Checkpoint, checker: StoreChecker) -> dict[str, tuple[StoreCheck, ...]]:
    """Every table's rank stores of ``ckpt`` checked at its commit, with the commit
    identities it recorded."""
    out = {}
    for table in ckpt.table_names:
        recorded = ckpt.recorded_commits(table)
        out[table] = tuple(
            checker.check(ckpt.store_path(r, table), ckpt.commit, recorded[r])
            for r in range(ckpt.num_workers)
        )
    return out


def _first_damage(checks: dict[str, tuple[StoreCheck, ...]]) -> str:
    """The first problem of ``checks``, and how many more there are."""
    several = len(checks) > 1
    lines = [
        f"{f'table {t}, ' if several else ''}rank {r}: {d}"
        for t, cs in checks.items()
        for r, c in enumerate(cs)
        for d in c.damage
    ]
    more = f"; and {len(lines) - 1} more problem(s)" if len(lines) > 1 else ""
    return lines[0] + more if lines else "none"


def _holds(check: StoreCheck, recorded: CommitId | None) -> bool:
    """Whether the store checked holds the checkpoint's own commit (its rows)."""
    return check.found is not None and (recorded is None or check.found == recorded)


def _away(ckpt: Checkpoint, check: StoreCheck, recorded: CommitId | None) -> str:
    """Why the store of ``check`` is not the checkpoint's, as ``stores that are ...``."""
    if not check.path.is_dir():
        return (
            f"not on this machine (no store at {check.path}): on the disks of the workers "
            "that trained it, or moved or deleted"
        )
    if check.found is not None and recorded is not None:
        what = f"its commit {ckpt.commit!r} is {check.found}, the checkpoint recorded {recorded}"
    else:
        what = check.damage[0] if check.damage else "it is not the recorded one"
    return (
        f"not on this machine: the store at {check.path} holds other rows ({what}; a stale "
        "copy or another run's store)"
    )


class _Unusable(Exception):
    """The checkpoint's copy cannot be read here; the message says why."""


def _copy(
    ckpt: Checkpoint, checker: StoreChecker
) -> tuple[Checkpoint, dict[str, tuple[StoreCheck, ...]]] | None:
    """The checkpoint's copy at ``checkpoint.replicate_to`` and its stores' checks; None when
    the run has no copy. Raises :class:`_Unusable` when it cannot be read."""
    replica = Replica.of(ckpt.config)
    if replica is None:
        return None
    url = ckpt.config.checkpoint.replicate_to  # as the config names it
    # A published version's copy is the copy of the candidate checkpoint it was frozen from:
    # the same files and rows, under the candidate's name and commit.
    name = Path(str(ckpt.extra.get("trained_as", ckpt.name))).name
    try:
        found = replica.local_checkpoint(name)
    except (CheckpointError, StorageError) as e:  # not in the copy; the store failed
        raise _Unusable(f"its copy cannot be read ({e})") from None
    if found.path.resolve() == ckpt.path.resolve():
        raise _Unusable(f"it is itself the copy at {url}")
    if not found.path.is_dir():
        raise _Unusable(f"its copy at {url} has no checkpoint {name}")
    if not isinstance(found, Checkpoint):
        raise _Unusable(f"its copy at {url} holds no usable {name} ({found.reason}; {found.kind})")
    if found.files != ckpt.files:
        raise _Unusable(
            f"the checkpoint {found.path} of its copy at {url} is another one (its files differ: "
            "another run copied there before)"
        )
    return found, _check_all(found, checker)

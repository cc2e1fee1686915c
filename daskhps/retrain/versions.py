"""The published-version registry of a retrained model.

A *version* is a complete checkpoint (dense model, optimizer state, manifest) plus the name of
the commit point it reached in every table shard store. The stores are append-only and shared
by all versions, so a version costs the rows its training wrote, never a copy of the table;
training from an older version after a rejected candidate reopens the stores at that
version's commit and appends after it. On disk, under ``<run.dir>/versions/``::

    registry.json   {"format": 1, "versions": [...], "attempts": [...], "events": [...]}
    CURRENT         the name of the published version, one line

Both are replaced atomically (temporary file, fsync, rename). Publishing writes the registry
first, then ``CURRENT``: a crash in between leaves a registered version that was never
current, which is harmless. Rolling back rewrites only ``CURRENT`` (and logs an event).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from daskhps.retrain._atomic import write_atomic
from daskhps.retrain.errors import RegistryError, UnknownVersionError, VersionNotFoundError
from daskhps.runfiles.published import REGISTRY, registry_folder

__all__ = ["Attempt", "Registry", "Version", "published_checkpoint"]

FORMAT = 1
Outcome = Literal["published", "rejected", "failed"]


@dataclass(frozen=True)
class Version:
    """One published model.

    Attributes
    ----------
    name:
        ``v000001``, ``v000002``, ... in publishing order.
    checkpoint:
        The checkpoint folder (dense model, optimizer state, ``MANIFEST.json``).
    commit:
        The commit point of every table shard store under ``stores_dir``.
    parent:
        The version it was trained from (None: trained from scratch).
    train_days:
        The days this version's run trained on, on top of its parent.
    trained_through:
        The last day any of its ancestors or itself trained on.
    eval_day:
        The day it was scored on (not trained on).
    metrics, baseline:
        The candidate's and its parent's metrics on the same rows of ``eval_day`` (for the
        first version, the baseline is the untrained model). A follower's version
        (``retrain --follow``) has no ``eval_day``: both are on its chunk, the baseline
        scored before the candidate trained on it (progressive validation).
    chunk, files, landed:
        A follower's version: the chunk it trained on (on top of its parent), the chunk's
        data files, and when the newest of them landed (seconds since the epoch).
    """

    name: str
    checkpoint: str
    commit: str
    stores_dir: str
    parent: str | None
    train_days: tuple[str, ...]
    trained_through: str
    eval_day: str
    metrics: dict[str, float] = field(default_factory=dict)
    baseline: dict[str, float] = field(default_factory=dict)
    created: float = 0.0
    chunk: str | None = None
    files: tuple[str, ...] = ()
    landed: float = 0.0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Version:
        return cls(
            **{**d, "train_days": tuple(d["train_days"]), "files": tuple(d.get("files", ()))}
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "train_days": list(self.train_days), "files": list(self.files)}


@dataclass(frozen=True)
class Attempt:
    """One retraining run that trained a candidate: published, rejected or failed."""

    id: str
    base: str | None
    train_days: tuple[str, ...]
    eval_day: str
    outcome: Outcome
    version: str | None = None
    reasons: tuple[str, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)
    baseline: dict[str, float] = field(default_factory=dict)
    time: float = 0.0
    chunk: str | None = None  # a follower's: the chunk it trained on, and its data files
    files: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Attempt:
        return cls(
            **{
                **d,
                "train_days": tuple(d["train_days"]),
                "reasons": tuple(d["reasons"]),
                "files": tuple(d.get("files", ())),
            }
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "train_days": list(self.train_days),
            "reasons": list(self.reasons),
            "files": list(self.files),
        }


class Registry:
    """The versions of one run directory: read on every call, so it is never stale.

    Writers must hold the run's :class:`~daskhps.retrain.lock.RetrainLock`.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / REGISTRY
        self.current_path = self.folder / "CURRENT"

    # -- reading ---------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"format": FORMAT, "versions": [], "attempts": [], "events": []}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, this version reads {FORMAT}")
            for key in ("versions", "attempts", "events"):
                if not isinstance(data.get(key), list):
                    raise ValueError(f"{key!r} is not a list")
            [Version.from_dict(v) for v in data["versions"]]
            [Attempt.from_dict(a) for a in data["attempts"]]
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            raise RegistryError(
                f"version registry {self.path} is unreadable ({e}); restore it from a backup, "
                "or move the versions folder away to start publishing from scratch"
            ) from e
        return data

    def versions(self) -> list[Version]:
        """Every published version, oldest first, its paths absolute."""
        return [self._absolute(Version.from_dict(v)) for v in self._read()["versions"]]

    def _absolute(self, v: Version) -> Version:
        """``v`` with its paths absolute: recorded relative to this folder (so a copied or
        moved retraining folder reads its own versions), or absolute by registries made
        before, which a copy reads in its own folder where it holds the same files."""
        checkpoint, stores = Path(v.checkpoint), Path(v.stores_dir)
        if not checkpoint.is_absolute():
            return replace(
                v,
                checkpoint=os.path.normpath(self.folder.absolute() / checkpoint),
                stores_dir=os.path.normpath(self.folder.absolute() / stores),
            )
        run_then, run_now = checkpoint.parent.parent, self.folder.absolute().parent
        if run_then == run_now or not (run_now / checkpoint.relative_to(run_then)).is_dir():
            return v
        if stores.is_relative_to(run_then) and (run_now / stores.relative_to(run_then)).is_dir():
            stores = run_now / stores.relative_to(run_then)
        return replace(
            v, checkpoint=str(run_now / checkpoint.relative_to(run_then)), stores_dir=str(stores)
        )

    def _recorded(self, v: Version) -> Version:
        """``v`` as the registry records it: paths inside the retraining folder relative to
        this folder."""
        run = self.folder.absolute().parent

        def rel(p: str) -> str:
            a = Path(os.path.abspath(p))
            return os.path.relpath(a, self.folder.absolute()) if a.is_relative_to(run) else str(a)

        return replace(v, checkpoint=rel(v.checkpoint), stores_dir=rel(v.stores_dir))

    def attempts(self) -> list[Attempt]:
        """Every run that trained a candidate, oldest first."""
        return [Attempt.from_dict(a) for a in self._read()["attempts"]]

    def events(self) -> list[dict[str, Any]]:
        """Publishes and rollbacks, oldest first: ``{"time", "action", "version", "from"}``."""
        return list(self._read()["events"])

    def get(self, name: str) -> Version:
        for v in self.versions():
            if v.name == name:
                return v
        known = ", ".join(v.name for v in self.versions()) or "none"
        raise UnknownVersionError(
            f"no version {name!r} in {self.path}; published versions: {known}"
        )

    def current(self) -> Version | None:
        """The version ``CURRENT`` names; None when nothing was published yet."""
        if not self.current_path.exists():
            return None
        name = self.current_path.read_text(encoding="utf-8").strip()
        try:
            return self.get(name)
        except VersionNotFoundError:
            raise RegistryError(
                f"{self.current_path} names version {name!r}, which {self.path} does not hold; "
                "point it at a published version with --rollback VERSION"
            ) from None

    def taken_files(self) -> set[str]:
        """The data files a follower has trained on: those of every published or rejected
        attempt (a failed one's are retried). Each is trained on once, however often the
        follower is stopped and started again."""
        return {f for a in self.attempts() if a.outcome != "failed" for f in a.files}

    def seen_through(self) -> str | None:
        """The newest day a run scored on (the days after it are new). Failed runs do not
        count: the next run retries their days."""
        days = [a.eval_day for a in self.attempts() if a.outcome != "failed" and a.eval_day]
        return max(days) if days else None

    # -- writing (under the run's lock) -------------------------------------------------

    def _write(self, data: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(data, indent=2) + "\n")

    def _set_current(self, name: str) -> None:
        write_atomic(self.current_path, name + "\n")

    def next_name(self) -> str:
        return f"v{len(self._read()['versions']) + 1:06d}"

    def record(self, attempt: Attempt) -> None:
        """Log a run whose candidate was rejected or failed (nothing becomes current)."""
        if attempt.outcome == "published":
            raise ValueError("a published attempt is recorded by publish()")
        data = self._read()
        data["attempts"].append(attempt.to_dict())
        self._write(data)

    def publish(self, version: Version, attempt: Attempt) -> None:
        """Register ``version`` with the run that made it, then make it current."""
        data = self._read()
        if any(v["name"] == version.name for v in data["versions"]):
            raise RegistryError(f"{self.path} already holds a version {version.name!r}")
        previous = self.current()
        data["versions"].append(self._recorded(version).to_dict())
        data["attempts"].append(attempt.to_dict())
        data["events"].append(
            {
                "time": time.time(),
                "action": "publish",
                "version": version.name,
                "from": previous.name if previous else None,
            }
        )
        self._write(data)
        self._set_current(version.name)

    def mark_removed(self, name: str) -> None:
        """Record that version ``name``'s folder and commit are gone (``keep_versions``)."""
        data = self._read()
        data["events"].append({"time": time.time(), "action": "remove", "version": name})
        self._write(data)

    def removed_names(self) -> set[str]:
        """The versions the retention rule removed."""
        return {str(e.get("version")) for e in self.events() if e.get("action") == "remove"}

    def removed(self, name: str) -> bool:
        """Whether version ``name`` was removed by the retention rule."""
        return name in self.removed_names()

    def rollback(self, name: str) -> tuple[Version | None, Version]:
        """Make the published version ``name`` current again; returns (previous, now)."""
        target = self.get(name)
        previous = self.current()
        data = self._read()
        data["events"].append(
            {
                "time": time.time(),
                "action": "rollback",
                "version": name,
                "from": previous.name if previous else None,
            }
        )
        self._write(data)
        self._set_current(name)
        return previous, target


def published_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint folder of the version ``CURRENT`` names, when ``path`` is a retraining
    run directory (or its ``versions/`` folder); None when it is neither. For readers that
    take "a model" as a path (``daskhps predict --model runs/retrain``)."""
    folder = registry_folder(path)
    if folder is None:
        return None
    current = Registry(folder).current()
    if current is None:
        raise VersionNotFoundError(
            f"{folder} holds no published version yet (no CURRENT); run "
            "`daskhps retrain CONFIG` until one is published, or give a checkpoint"
        )
    return Path(current.checkpoint)

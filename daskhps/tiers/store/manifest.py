"""Commit manifests of the zarr store: small JSON files, each made visible by one atomic rename.

A manifest names a commit and says how to rebuild its key -> location index: load the index
snapshot ``snapshot`` (if any), then replay the key arrays of the ``replay`` segments in order,
later segments winning. ``segments`` lists every segment the state reads rows from, so
garbage collection knows what a commit keeps alive. ``attached`` names the arrays the commit
carries beside its rows (``attached/<seq>/<name>``, written by commit ``seq``; the table keeps
its not-yet-admitted keys' counts there), shared by every later commit that kept them.
``commits/<seq>.json`` is written as
``commits/<seq>.json.tmp``, fsynced and renamed: a crash leaves either no manifest or a
complete one, and stray ``.tmp`` files are never read.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daskhps.tiers.base import CommitInfo
from daskhps.tiers.store.durable import fsync_dir

__all__ = [
    "ATTACHED_NAME",
    "Attached",
    "Manifest",
    "manifest_path",
    "scan_manifests",
    "write_manifest",
]

FORMAT = 1  # "attached" is optional: a manifest without it carries no arrays
_FILE = re.compile(r"^(\d+)\.json$")
ATTACHED_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True)
class Attached:
    """The arrays a commit carries: ``names``, in ``attached/<seq>/``."""

    seq: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class Manifest:
    """One commit manifest as stored (see the module docstring)."""

    path: Path
    seq: int
    name: str
    time: float
    meta: dict[str, Any]
    snapshot: int | None
    replay: list[int]
    segments: list[int]
    rows: int
    since_snapshot: int
    wrote_snapshot: bool
    attached: Attached | None = None

    @property
    def info(self) -> CommitInfo:
        return CommitInfo(
            name=self.name,
            seq=self.seq,
            time=self.time,
            rows=self.rows,
            snapshot=self.wrote_snapshot,
            segments=len(self.segments),
            meta=self.meta,
        )

    def to_json(self) -> str:
        d = {
            "format": FORMAT,
            "seq": self.seq,
            "name": self.name,
            "time": self.time,
            "meta": self.meta,
            "snapshot": self.snapshot,
            "replay": self.replay,
            "segments": self.segments,
            "rows": self.rows,
            "since_snapshot": self.since_snapshot,
            "wrote_snapshot": self.wrote_snapshot,
        }
        if self.attached is not None:
            d["attached"] = {"seq": self.attached.seq, "names": list(self.attached.names)}
        return json.dumps(d, indent=1)

    @classmethod
    def parse(cls, path: Path, seq: int) -> Manifest:
        """Read and check a manifest; raise ``ValueError`` describing what is wrong."""
        d = json.loads(path.read_text())
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        want: dict[str, Any] = {
            "format": int,
            "seq": int,
            "name": str,
            "time": (int, float),
            "meta": dict,
            "replay": list,
            "segments": list,
            "rows": int,
            "since_snapshot": int,
            "wrote_snapshot": bool,
        }
        for k, t in want.items():
            if not isinstance(d.get(k), t):
                raise ValueError(f"field {k!r} is missing or has the wrong type")
        if d["format"] > FORMAT:
            raise ValueError(f"format {d['format']} is newer than this daskhps reads ({FORMAT})")
        if d["seq"] != seq:
            raise ValueError(f"seq {d['seq']} does not match the file name")
        snap = d.get("snapshot")
        ids = [*d["replay"], *d["segments"]]
        if not (snap is None or isinstance(snap, int)) or not all(isinstance(i, int) for i in ids):
            raise ValueError("segment and snapshot ids must be integers")
        attached = d.get("attached")
        if attached is not None:
            names = attached.get("names") if isinstance(attached, dict) else None
            if (
                not isinstance(attached.get("seq"), int)
                or not isinstance(names, list)
                or not all(isinstance(n, str) and ATTACHED_NAME.match(n) for n in names)
            ):
                raise ValueError("field 'attached' must be {seq: int, names: [name, ...]}")
            attached = Attached(attached["seq"], tuple(names))
        return cls(
            path=path,
            seq=seq,
            name=d["name"],
            time=float(d["time"]),
            meta=d["meta"],
            snapshot=snap,
            replay=list(d["replay"]),
            segments=list(d["segments"]),
            rows=d["rows"],
            since_snapshot=d["since_snapshot"],
            wrote_snapshot=d["wrote_snapshot"],
            attached=attached,
        )


def scan_manifests(directory: Path) -> tuple[list[Manifest], dict[int, tuple[Path, str]]]:
    """All manifests of ``directory`` by ``seq``: the readable ones and, separately, the
    damaged ones (``seq -> (file, reason)``)."""
    good: list[Manifest] = []
    bad: dict[int, tuple[Path, str]] = {}
    if not directory.is_dir():
        return good, bad
    for entry in os.listdir(directory):
        m = _FILE.match(entry)
        if not m:
            continue  # .tmp files of commits that never completed, and anything else
        seq, path = int(m.group(1)), directory / entry
        try:
            good.append(Manifest.parse(path, seq))
        except (OSError, ValueError) as e:
            bad[seq] = (path, str(e) or type(e).__name__)
    good.sort(key=lambda m: m.seq)
    return good, bad


def manifest_path(directory: Path, seq: int) -> Path:
    return directory / f"{seq:010d}.json"


def write_manifest(directory: Path, manifest: Manifest) -> None:
    """Write ``manifest`` durably and atomically (tmp file, fsync, rename, fsync folder)."""
    tmp = manifest.path.with_name(manifest.path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(manifest.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, manifest.path)
    fsync_dir(directory)

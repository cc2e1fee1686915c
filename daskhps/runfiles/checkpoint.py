"""Checkpoints of a training run on disk: what one holds, how it becomes visible, how to find it.

::

    <run.dir>/checkpoints/
      pass-000002/                 <name> = passes of the run completed when it was taken
        dense.pt                   torch.save({"model", "optimizer", "rng"}), weights_only
        state.json                 plan position (epoch, pass, step), the pass's metrics
        MANIFEST.json              written last (fsync, atomic rename): the checkpoint exists
      pass-000003/ ...

The tables' rows are not copied: every shard store ``<stores_dir>/<table>/rank-<r>`` (one per
table and rank) holds a commit point named like the checkpoint (``commit``), and a store's
commit costs only the rows written since its previous one. A folder without
``MANIFEST.json``, or whose files do not match the sizes and sha256 sums it records, is never
loaded; :func:`scan_checkpoints` says which were skipped and why, and
:func:`latest_checkpoint` logs each as a warning.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from daskhps.errors import CheckpointError
from daskhps.runfiles.locations import stores_of
from daskhps.runfiles.manifest import FORMAT, CheckpointManifest, ManifestError
from daskhps.table.table import open_shard_store
from daskhps.tiers.store import StoreReader
from daskhps.tiers.store.check import CommitId, StoreChecker
from daskhps.tiers.store.durable import file_sha256
from daskhps.tiers.store.layout import layout_of_today

if TYPE_CHECKING:
    from daskhps.config import RunConfig
    from daskhps.table import TableSpec

__all__ = [
    "DENSE",
    "FORMAT",
    "MANIFEST",
    "STATE",
    "Checkpoint",
    "Skipped",
    "check_checkpoint",
    "checkpoint_name",
    "checkpoints_dir",
    "commit_record",
    "find_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "model_among",
    "model_checkpoint",
    "scan_checkpoints",
    "store_damage",
]

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
DENSE = "dense.pt"
STATE = "state.json"
_NAME = re.compile(r"^pass-(\d{6,})$")


def commit_record(info: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint notes of one rank store's commit (``WorkerShards.commit``'s answer)."""
    return CommitId(int(info["seq"]), float(info["time"]), int(info["rows"])).to_json()


def checkpoint_name(passes_done: int) -> str:
    """``pass-000012``: the name of the checkpoint taken after ``passes_done`` passes."""
    return f"pass-{passes_done:06d}"


def checkpoints_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / "checkpoints"


@dataclass(frozen=True, kw_only=True)
class Checkpoint(CheckpointManifest):
    """One complete checkpoint: its folder and its verified manifest, whose fields
    (:class:`~daskhps.runfiles.manifest.CheckpointManifest`) it carries as attributes.

    Serving needs nothing else: the stores (:attr:`stores_dir`, opened read-only at
    :attr:`commit`), the routing (``ShardMap(num_shards, num_workers)``), the dense model
    (``config.model`` + :meth:`dense_state`).
    """

    path: Path

    @classmethod
    def at(cls, path: str | os.PathLike[str], manifest: dict[str, Any]) -> Checkpoint:
        """The checkpoint in ``path`` whose manifest reads ``manifest`` (raises
        :class:`~daskhps.runfiles.manifest.ManifestError` when it lacks fields)."""
        fields = cls.json_fields(manifest)
        fields["stores_dir"] = stores_of(Path(path), fields["stores_dir"], fields["run_config"])
        return cls(path=Path(path), **fields)

    @property
    def table_names(self) -> tuple[str, ...]:
        """Every table's name, in index order (one: the run's table)."""
        return tuple(str(t["table"]) for t in (self.tables or [self.table]))

    def recorded_commits(self, table: str | None = None) -> list[CommitId | None]:
        """Per rank, the commit of ``table``'s store (default: the first table's) this
        checkpoint was taken as (None where the manifest predates such records)."""
        name = table or self.table_names[0]
        if name not in self.table_names:
            raise CheckpointError(
                f"checkpoint {self.path} has no table {name!r}; its tables: "
                f"{', '.join(self.table_names)}"
            )
        by_rank = {}
        for s in self.shards:
            if "rank" not in s:
                continue
            # format 2 records every table's commit; the shard's own fields are the first's
            first = name == self.table_names[0]
            record = s.get("tables", {}).get(name) or (s if first else {})
            by_rank[int(s["rank"])] = CommitId.from_json(record)
        return [by_rank.get(r) for r in range(self.num_workers)]

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest as ``MANIFEST.json`` holds it."""
        return self.to_json()

    @functools.cached_property
    def config(self) -> RunConfig:
        """The run's config as the manifest records it (parsed once: with unequal widths the
        check builds the model)."""
        from daskhps.config import RunConfig

        return RunConfig.from_dict(self.run_config, source=str(self.path / MANIFEST))

    @property
    def table_spec(self) -> TableSpec:
        """The table's spec; its layout is the one the stores were written with."""
        spec = self.config.table_spec()
        # A checkpoint from before rows had statistics: its stores open with them (as zeros).
        if spec.layout() != layout_of_today(self.table, spec.layout()):
            raise CheckpointError(
                f"checkpoint {self.path}: the table layout in {MANIFEST} "
                f"({self.table}) differs from its config's ({spec.layout()}); "
                "the manifest was edited by hand: restore it or use another checkpoint"
            )
        return spec

    @property
    def table_specs(self) -> tuple[TableSpec, ...]:
        """Every table's spec (one: :attr:`table_spec`), as the stores were written."""
        if not self.tables:
            return (self.table_spec,)
        specs = self.config.table_specs()
        if [s.layout() for s in specs] != self.tables:
            raise CheckpointError(
                f"checkpoint {self.path}: the table layouts in {MANIFEST} differ from its "
                "config's; the manifest was edited by hand: restore it or use another checkpoint"
            )
        return specs

    def spec_of(self, table: str | None = None) -> TableSpec:
        """The spec of ``table`` (default: the first table), as its stores were written."""
        name = table or self.table_names[0]
        for spec in self.table_specs:
            if spec.name == name:
                return spec
        raise CheckpointError(
            f"checkpoint {self.path} has no table {name!r}; its tables: "
            f"{', '.join(self.table_names)}"
        )

    def store_path(self, rank: int, table: str | None = None) -> Path:
        """The store of rank ``rank``'s shard of ``table`` (default: the first table)."""
        return self.stores_dir / (table or self.table_names[0]) / f"rank-{rank}"

    def rank_stores(self, rank: int) -> list[Path]:
        """Rank ``rank``'s store of every table, in table order."""
        return [self.store_path(rank, t) for t in self.table_names]

    def open_store(
        self, rank: int, mode: Literal["r", "r+"] = "r", table: str | None = None
    ) -> StoreReader:
        """Rank ``rank``'s store of ``table`` (default: the first table), at this
        checkpoint's commit."""
        return open_shard_store(
            self.spec_of(table), self.store_path(rank, table), mode=mode, commit=self.commit
        )

    def state(self) -> dict[str, Any]:
        """``state.json``: plan position (``epoch``, ``pass``, ``step``) and the pass record."""
        return dict(json.loads((self.path / STATE).read_text()))

    def _dense(self) -> dict[str, Any]:
        try:
            out = torch.load(self.path / DENSE, map_location="cpu", weights_only=True)
        except Exception as e:  # unpickling errors have many types
            raise CheckpointError(f"checkpoint {self.path}: cannot read {DENSE}: {e}") from e
        if not isinstance(out, dict) or "model" not in out or "optimizer" not in out:
            raise CheckpointError(
                f"checkpoint {self.path}: {DENSE} lacks 'model' or 'optimizer'; it was not "
                "written by daskhps: use another checkpoint"
            )
        return out

    def dense_state(self) -> dict[str, torch.Tensor]:
        """The dense model's ``state_dict``."""
        return dict(self._dense()["model"])

    def optimizer_state(self) -> dict[str, Any]:
        """The dense optimizer's ``state_dict``."""
        return dict(self._dense()["optimizer"])

    def rng_states(self) -> list[torch.Tensor]:
        """Each rank's torch CPU RNG state when the checkpoint was taken (rank order)."""
        return list(self._dense().get("rng", []))


# -- reading ------------------------------------------------------------------------------

SkipKind = Literal["incomplete", "unreadable", "newer", "damaged"]


@dataclass(frozen=True)
class Skipped:
    """A folder of ``checkpoints/`` that is never loaded, and why.

    Attributes
    ----------
    kind:
        ``"incomplete"``: no ``MANIFEST.json`` (its writing never finished, e.g. a killed
        run); ``"unreadable"``: the manifest does not parse or lacks fields; ``"newer"``: it
        was written by a newer daskhps; ``"damaged"``: a file is missing or its size or
        sha256 differs from what the manifest records.
    reason:
        What is wrong, naming each file (``dense.pt is 1234 bytes, the manifest says ...``).
    """

    path: Path
    kind: SkipKind
    reason: str

    @property
    def name(self) -> str:
        return self.path.name

    def __str__(self) -> str:
        return f"checkpoint {self.name}: {self.reason} ({self.kind}; never loaded)"


def _file_problems(folder: Path, files: dict[str, Any]) -> list[str]:
    """One line per file of the manifest that is missing or differs from it."""
    out = []
    for fname, info in files.items():
        p = folder / fname
        if not p.is_file():
            out.append(f"{fname} is missing")
            continue
        size = p.stat().st_size
        if size != info["size"]:
            out.append(f"{fname} is {size} bytes, the manifest says {info['size']}")
        elif file_sha256(p) != info["sha256"]:
            out.append(
                f"{fname} does not match the sha256 in the manifest (same size, {size} bytes, "
                "different bytes)"
            )
    return out


def check_checkpoint(folder: str | os.PathLike[str]) -> Checkpoint | Skipped:
    """The checkpoint in ``folder`` (every file verified), or why it is never loaded."""
    folder = Path(folder)
    mpath = folder / MANIFEST
    if not mpath.is_file():
        return Skipped(folder, "incomplete", f"no {MANIFEST}: its writing never finished")
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        return Skipped(folder, "unreadable", f"{MANIFEST} does not parse ({e})")
    try:
        Checkpoint.json_fields(manifest)
    except ManifestError as e:
        return Skipped(folder, "unreadable", f"{MANIFEST} {e}")
    if not isinstance(manifest["format"], int) or manifest["format"] > FORMAT:
        return Skipped(
            folder,
            "newer",
            f"checkpoint format {manifest['format']!r} is newer than this daskhps reads "
            f"({FORMAT}; written by daskhps {manifest.get('daskhps_version')}); upgrade",
        )
    files = manifest["files"]
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and {"size", "sha256"} <= set(v) for v in files.values()
    ):
        return Skipped(folder, "unreadable", f"{MANIFEST}: 'files' lacks sizes or sha256 sums")
    problems = _file_problems(folder, files)
    if problems:
        return Skipped(folder, "damaged", "; ".join(problems))
    return Checkpoint.at(folder, manifest)


def _verify(folder: Path) -> Checkpoint:
    """The checkpoint in ``folder``, or :class:`CheckpointError` saying what is wrong."""
    found = check_checkpoint(folder)
    if isinstance(found, Checkpoint):
        return found
    if found.kind == "newer":
        raise CheckpointError(f"{folder / MANIFEST}: {found.reason}")
    raise CheckpointError(
        f"checkpoint {folder} cannot be used: {found.reason} ({found.kind}); use an earlier "
        "checkpoint (`daskhps inspect` on its run directory lists them)"
    )


def scan_checkpoints(run_dir: str | os.PathLike[str]) -> tuple[list[Checkpoint], list[Skipped]]:
    """Every ``pass-NNNNNN`` folder of a run: the complete, verified checkpoints (oldest
    first) and, separately, the ones never loaded with the reason (by name)."""
    folder = checkpoints_dir(run_dir)
    if not folder.is_dir():
        return [], []
    good: list[Checkpoint] = []
    skipped: list[Skipped] = []
    for entry in sorted(os.listdir(folder)):
        if _NAME.match(entry) and (folder / entry).is_dir():
            found = check_checkpoint(folder / entry)
            if isinstance(found, Checkpoint):
                good.append(found)
            else:
                skipped.append(found)
    return sorted(good, key=lambda c: c.passes_done), skipped


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[Checkpoint]:
    """The complete, verified checkpoints of a run, oldest first; the others are skipped
    (:func:`scan_checkpoints` says which and why)."""
    return scan_checkpoints(run_dir)[0]


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Checkpoint | None:
    """The newest complete checkpoint of a run, or None. Logs a warning naming each folder
    it skipped and why: a damaged newest checkpoint must not pass unnoticed."""
    found = _complete(run_dir)
    return found[-1] if found else None


def _complete(run_dir: str | os.PathLike[str]) -> list[Checkpoint]:
    """:func:`list_checkpoints`, with a warning naming each folder skipped and why: where a
    checkpoint is chosen, a damaged one must not pass unnoticed."""
    found, skipped = scan_checkpoints(run_dir)
    for s in skipped:
        log.warning("skipping %s", s)
    return found


def model_checkpoint(run_dir: str | os.PathLike[str]) -> Checkpoint | None:
    """The run's model: the checkpoint the latest names as its best (``eval.best_by``,
    never removed by retention), else the latest; None without a complete checkpoint."""
    return model_among(_complete(run_dir))


def model_among(found: list[Checkpoint]) -> Checkpoint | None:
    """Of a run's complete checkpoints (oldest first), the one its latest names its model;
    the latest when it names none, or one that is not among them (said in a warning)."""
    if not found:
        return None
    latest = found[-1]
    named = (latest.model or {}).get("checkpoint")
    if named is None or named == latest.name:
        return latest
    for c in found:
        if c.name == named:
            return c
    log.warning(
        "%s names %s its best checkpoint, which is not complete here: taking %s instead",
        latest.path,
        named,
        latest.name,
    )
    return latest


def find_checkpoint(run_dir: str | os.PathLike[str], name: str) -> Checkpoint:
    """The checkpoint ``name`` (``pass-000003``, or just ``3``) of a run directory.

    Raises
    ------
    CheckpointError
        One line naming the checkpoint and why it cannot be used (no such folder, or
        incomplete, unreadable or damaged, with the reason) and listing the valid ones.
    """
    run = Path(run_dir)
    wanted = checkpoint_name(int(name)) if name.isdigit() else name
    found, skipped = scan_checkpoints(run)
    valid = ", ".join(c.name for c in found) or "none"
    for c in found:
        if c.name == wanted:
            return c
    for s in skipped:
        if s.name == wanted:
            raise CheckpointError(
                f"checkpoint {wanted} of {run} cannot be used: {s.reason} ({s.kind}); valid "
                f"checkpoints: {valid}"
            )
    if not checkpoints_dir(run).is_dir():
        raise CheckpointError(
            f"{run} is not a run directory (no checkpoints/ folder), so it has no checkpoint "
            f"{wanted}; give the run directory (run.dir of its config)"
        )
    raise CheckpointError(
        f"run directory {run} has no checkpoint {wanted!r}; valid checkpoints: {valid}"
    )


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """A checkpoint folder, or a run directory (its model: :func:`model_checkpoint`)."""
    p = Path(path)
    if (p / MANIFEST).exists() or _NAME.match(p.name):
        return _verify(p)
    if checkpoints_dir(p).is_dir() or (p / "config.yaml").is_file():
        model = model_checkpoint(p)
        if model is None:
            raise CheckpointError(
                f"run directory {p} has no complete checkpoint in {checkpoints_dir(p)}; "
                "train with checkpoint.every_passes >= 1 first"
            )
        return model
    if not p.exists():
        raise CheckpointError(f"{p} does not exist; give a checkpoint folder or a run directory")
    raise CheckpointError(
        f"{p} is neither a checkpoint (no {MANIFEST}) nor a run directory (no checkpoints/); "
        "give <run.dir> or <run.dir>/checkpoints/pass-NNNNNN"
    )


def store_damage(ckpt: Checkpoint, *, verify: bool = False) -> list[str]:
    """Problems of the stores a checkpoint reads (every table's store of every rank, at the
    commit ``ckpt.commit`` each recorded), one line each naming the table, rank and file;
    empty when sound. Checks file sizes against the stores' metadata (cheap: a ``stat`` per
    file); ``verify`` also recomputes the sha256 recorded for each chunk file (reads every
    byte). For callers about to open the stores (a resume, a scoring job) that want to stop
    early with the checkpoint named."""
    checker = StoreChecker(verify=verify)
    out = []
    for table in ckpt.table_names:  # every table's stores: one damaged store fails the rank
        ranks = [ckpt.store_path(r, table) for r in range(ckpt.num_workers)]
        lines = checker.rank_damage(ranks, ckpt.commit, ckpt.recorded_commits(table))
        out += [f"table {table}, {line}" if ckpt.tables else line for line in lines]
    return out

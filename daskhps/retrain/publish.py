"""Freeze a candidate's checkpoint as a published version.

A training run names its store commits after its checkpoints (``pass-000003``), and every
candidate trained from the same version writes into the same append-only stores: a later
candidate's ``pass-000003`` would replace an earlier one's. Publishing therefore gives the
candidate's state a commit name no other run uses (``version-v000002``) in every rank store,
and writes the version's own checkpoint folder beside the registry::

    <run.dir>/versions/v000002/   dense.pt, state.json   copied (the dense model: small)
                                  MANIFEST.json          commit: version-v000002 (written last)

The table is never copied: the new commit records the same rows (an index snapshot or the
list of segments to replay). On a cluster each rank store is committed by the worker whose
disk holds it (:mod:`daskhps.retrain.stores`); the driver writes only the version's folder.
``daskhps predict --model <run.dir>/versions/v000002`` and any other reader of checkpoints load
a version like a checkpoint.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from daskhps.errors import CheckpointError
from daskhps.retrain.stores import Disks, commit_version
from daskhps.runfiles.checkpoint import Checkpoint
from daskhps.runfiles.locations import recorded_stores_dir
from daskhps.runfiles.published import VERSION_PREFIX
from daskhps.runfiles.writing import finish_checkpoint, remove_checkpoint
from daskhps.tiers.base import CommitInfo
from daskhps.tiers.store.check import CommitId

__all__ = ["commit_name", "freeze_version"]

_FILLED_IN = ("format", "daskhps_version", "name", "created", "files")


def commit_name(version: str) -> str:
    """The store commit of a published version: never written by a training run."""
    return f"{VERSION_PREFIX}{version}"


def _by_rank(shards: list[dict[str, Any]], ranks: int) -> list[dict[str, Any]]:
    """A checkpoint's shard records in rank order (a rank without one: only its number)."""
    known = {int(s["rank"]): s for s in shards if "rank" in s}
    return [known.get(r, {"rank": r}) for r in range(ranks)]


def _version_shard(
    shard: dict[str, Any], commits: dict[str, CommitInfo], *, several: bool, first: str
) -> dict[str, Any]:
    """A candidate's shard record with the version's commits: the first table's in the
    record itself, every table's under ``tables`` (several tables)."""
    ids = {t: CommitId(c.seq, c.time, c.rows).to_json() for t, c in commits.items()}
    out = {**shard, **ids[first]}
    if several:  # each table's bytes stay: the version's stores are the candidate's
        tables = shard.get("tables", {})
        out["tables"] = {t: {**tables.get(t, {}), **ids[t]} for t in ids}
    return out


def _copy_durably(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)  # on disk before the manifest that vouches for it
    finally:
        os.close(fd)


def freeze_version(
    ckpt: Checkpoint, folder: Path, version: str, disks: Disks | None = None
) -> Checkpoint:
    """Publishable copy of ``ckpt`` in ``folder`` whose stores commit is only this version's.

    The stores are committed where they lie (``disks``: the cluster's workers, each on its own
    disk; None: this machine, see :mod:`daskhps.retrain.stores`); only the small files of the
    checkpoint are copied here. Crash-safe in this order: store commits (an unused commit is
    harmless), payload files, manifest last. A folder left by an earlier, interrupted try is
    replaced.
    """
    name = commit_name(version)
    meta = {"version": version, "checkpoint": str(ckpt.path)}
    commits = commit_version(disks or Disks(), ckpt, name, meta, version)
    if folder.exists():
        remove_checkpoint(folder)
    folder.mkdir(parents=True)
    try:
        for fname in ckpt.files:
            _copy_durably(ckpt.path / fname, folder / fname)
        fields = {k: v for k, v in ckpt.manifest.items() if k not in _FILLED_IN}
        fields.update(commit=name, version=version, trained_as=str(ckpt.path))
        # relative to the version's folder, inside the retraining folder (<run.dir>/versions/
        # <name>): a copied or moved retraining folder serves its own stores
        fields["stores_dir"] = recorded_stores_dir(ckpt.stores_dir, folder.parent.parent, folder)
        fields["shards"] = [  # the version's own commits, not the candidate's
            _version_shard(s, c, several=bool(ckpt.tables), first=ckpt.table_names[0])
            for s, c in zip(_by_rank(ckpt.shards, ckpt.num_workers), commits, strict=True)
        ]
        return finish_checkpoint(folder, dict(ckpt.files), fields)
    except OSError as e:
        remove_checkpoint(folder)
        raise CheckpointError(
            f"publishing {version}: writing {folder} failed ({e}); nothing was published and "
            "the current version is unchanged: free disk space and run again"
        ) from e
    except BaseException:
        remove_checkpoint(folder)
        raise

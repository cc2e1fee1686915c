"""What serving reads: a published table version, and a model ready to score.

A :class:`TableVersion` names one committed state of a sharded table::

    <stores_dir>/<table>/rank-0   ... rank-<W-1>     one zarr store per training rank
    commit <name> in every store                      (a checkpoint names its commit)
    owner of a key: ShardMap(num_shards, W).worker(key)

A :class:`Servable` adds the run config (schema, model) and the dense weights. It comes from a
checkpoint folder, a run directory (its latest checkpoint) or a retraining run's published
version with :func:`load_servable`. A run with several embedding tables has a
:class:`TableVersion` per table (``Servable.tables``, in the run's table order: a key's table
index, bits 56..62, picks one), all at the same commit of the same stores folder.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from daskhps.errors import CheckpointError, ConfigError, DaskHPSError
from daskhps.sharding import ShardMap
from daskhps.table.spec import TableSpec

if TYPE_CHECKING:
    from daskhps.config import RunConfig
    from daskhps.runfiles.checkpoint import Checkpoint

__all__ = ["Servable", "TableVersion", "load_servable"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableVersion:
    """One committed state of a table sharded over ``num_workers`` rank stores."""

    stores_dir: Path
    spec: TableSpec
    num_workers: int
    num_shards: int
    commit: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "stores_dir", Path(self.stores_dir))
        ShardMap(self.num_shards, self.num_workers)  # validates both counts

    @property
    def shard_map(self) -> ShardMap:
        return ShardMap(self.num_shards, self.num_workers)

    def store_path(self, rank: int) -> Path:
        return self.stores_dir / self.spec.name / f"rank-{rank}"

    def describe(self) -> str:
        return (
            f"table {self.spec.name!r} at commit {self.commit!r} of {self.stores_dir} "
            f"({self.num_workers} rank stores)"
        )


@dataclass(frozen=True)
class Servable:
    """A model ready to score: run config, dense weights and the table version it reads.

    Attributes
    ----------
    name:
        The checkpoint's name (or any label), reported in outputs.
    config:
        The run config the model was trained with (schema, model, table).
    dense_state:
        The dense model's ``state_dict``.
    table:
        Where the embedding rows are: the run's table, or its first of several.
    tables:
        Every table's version, in the run's table order (a key's table index picks one);
        left out: ``(table,)``.
    chosen:
        Why a run directory gave this checkpoint when it is not the run's latest (its best
        by the holdout); empty otherwise.
    """

    name: str
    config: RunConfig
    dense_state: dict[str, torch.Tensor]
    table: TableVersion
    tables: tuple[TableVersion, ...] = ()
    chosen: str = ""

    def __post_init__(self) -> None:
        if not self.tables:
            object.__setattr__(self, "tables", (self.table,))

    @property
    def several_tables(self) -> bool:
        """True when the keys carry their table's index (daskhps.data.keyspace)."""
        return len(self.tables) > 1

    def build_model(self) -> torch.nn.Module:
        """The dense model with the trained weights, in eval mode."""
        cfg = self.config
        model = cfg.build_model()
        try:
            model.load_state_dict(self.dense_state)
        except RuntimeError as e:
            raise ConfigError(
                f"model {self.name!r}: the saved dense weights do not fit the model its config "
                f"describes ({str(e).splitlines()[0]}); the checkpoint is damaged or was "
                "written by another model definition"
            ) from e
        return model.eval()

    @classmethod
    def from_checkpoint(cls, ckpt: Any) -> Servable:
        """From a :class:`daskhps.runfiles.checkpoint.Checkpoint`."""
        cfg = ckpt.config
        tables = tuple(
            TableVersion(
                stores_dir=Path(ckpt.stores_dir),
                spec=spec,
                num_workers=int(ckpt.num_workers),
                num_shards=int(ckpt.num_shards),
                commit=str(ckpt.commit),
            )
            for spec in ckpt.table_specs
        )
        return cls(str(ckpt.name), cfg, ckpt.dense_state(), tables[0], tables)


def load_servable(path: str | Path, checkpoint: str | None = None) -> Servable:
    """The model at ``path``: a checkpoint folder, a published version's folder, a training
    run directory (its latest complete checkpoint, or the one named ``checkpoint``, e.g.
    ``pass-000003``), a retraining run directory (the version its registry names current), or
    a run's copy in object storage (a URL: its newest checkpoint or ``checkpoint``, read
    through the local cache of :mod:`daskhps.runfiles.copycache`).

    Raises
    ------
    CheckpointError
        When ``path`` holds no complete checkpoint (torn, damaged, or none at all), or the
        checkpoint named is missing or damaged (the message lists the valid ones).
    StoreNotFoundError
        When the checkpoint's stores are not on this machine (on its workers' disks, or
        another's rows at their path) and it has no sound copy at ``checkpoint.replicate_to``
        to read them from instead (:func:`daskhps.runfiles.reading.stores_here`).
    """
    from daskhps.retrain.versions import published_checkpoint
    from daskhps.runfiles.checkpoint import MANIFEST, find_checkpoint, load_checkpoint
    from daskhps.runfiles.copycache import fetched_model
    from daskhps.runfiles.published import registry_folder

    local, checkpoint = fetched_model(str(path), checkpoint)  # a URL: the local cache's
    p = Path(local)
    chosen = ""
    if checkpoint is None:
        ckpt = load_checkpoint(published_checkpoint(p) or p)
        chosen = _which(p, ckpt)
    elif (p / MANIFEST).is_file():
        raise CheckpointError(
            f"a checkpoint name ({checkpoint!r}, --checkpoint) picks one of a run directory's "
            f"checkpoints, but {p} is a checkpoint folder: give its run directory "
            f"({p.parent.parent}) with the name, or leave the name out"
        )
    elif registry_folder(p) is not None:
        raise CheckpointError(
            f"a checkpoint name ({checkpoint!r}, --checkpoint) picks one of a training run "
            f"directory's checkpoints, but {p} is a retraining run (it serves its current "
            "published version): give a training run directory or a version's folder with "
            "the name, or leave the name out"
        )
    else:
        ckpt = find_checkpoint(p, checkpoint)
    from daskhps.runfiles.reading import stores_here

    reading = stores_here(ckpt)  # its stores on other machines' disks: its copy, if it has one
    stores = reading.require()
    if reading.from_copy:
        log.warning("checkpoint %s: its rows are %s", ckpt.path, reading.note)
    try:
        servable = Servable.from_checkpoint(stores)
    except DaskHPSError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"checkpoint {ckpt.path}: its manifest is unusable for serving ({e!r}); use "
            "another checkpoint"
        ) from e
    # the name of the checkpoint asked for (a published version's, not its copy's candidate)
    return replace(servable, name=str(ckpt.name), chosen=chosen)


def _which(asked: Path, ckpt: Checkpoint) -> str:
    """Why the run directory ``asked`` gave ``ckpt`` when it is not the run's latest: it is
    its best by the holdout (``eval.best_by``, docs/checkpoints.md); empty otherwise."""
    model = ckpt.model or {}
    if ckpt.path.parent.parent != asked or model.get("checkpoint") != ckpt.name:
        return ""  # a checkpoint or version asked for by its folder, or the run's latest
    from daskhps.runfiles.checkpoint import latest_checkpoint

    latest = latest_checkpoint(asked)
    if latest is None or latest.name == ckpt.name:
        return ""
    return (
        f"the run's model: its best holdout {model['metric']} {float(model['value']):.4f}, of "
        f"pass {ckpt.passes_done}; --checkpoint {latest.name} takes its latest"
    )

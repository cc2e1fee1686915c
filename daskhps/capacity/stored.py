"""Rows a run's stores already hold: what ``train --resume`` opens before it reads a log.

A resumed run, or one whose table came from ``daskhps import``, opens every rank's store at
the newest checkpoint's commit; its key index then holds every stored row, whatever the logs
use. Each store commit records its row count (:class:`daskhps.tiers.store.manifest.Manifest`), so
this reads one small JSON file per rank and never opens a store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from daskhps.tiers.store.check import CommitId
from daskhps.tiers.store.manifest import scan_manifests

if TYPE_CHECKING:
    from daskhps.runfiles.checkpoint import Checkpoint

__all__ = ["StoredTable", "stored_table"]


@dataclass(frozen=True)
class StoredTable:
    """The tables a resume would open: the checkpoint and each rank's stored rows (of all its
    tables; ``tables``: each table's, when the checkpoint has several)."""

    checkpoint: str
    rows_per_rank: tuple[int, ...]
    tables: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def busiest(self) -> int:
        return max(self.rows_per_rank, default=0)

    def busiest_of(self, table: str) -> int:
        """The most rows one rank's store of ``table`` holds (0 for a table the checkpoint
        does not have)."""
        if not self.tables:
            return self.busiest
        return max(dict(self.tables).get(table, ()), default=0)


def stored_table(run_dir: str | Path) -> StoredTable | None:
    """The newest complete checkpoint of ``run_dir`` and its stores' rows, or None without one
    (a rank whose commit cannot be read counts 0: ``train --resume`` refuses it anyway)."""
    # Loaded here: training imports capacity (the trainer sizes the run before it starts).
    from daskhps.runfiles.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir) if Path(run_dir).is_dir() else None
    if ckpt is None:
        return None
    names = ckpt.table_names
    per_table = tuple(
        (name, tuple(_rows(ckpt, r, name, c) for r, c in enumerate(ckpt.recorded_commits(name))))
        for name in names
    )
    totals = tuple(sum(rows[r] for _, rows in per_table) for r in range(ckpt.num_workers))
    return StoredTable(ckpt.name, totals, per_table if len(names) > 1 else ())


def _rows(ckpt: Checkpoint, rank: int, table: str, recorded: CommitId | None) -> int:
    """Rows of rank ``rank``'s store of ``table`` at the checkpoint's commit: as the
    checkpoint noted it (the stores may be on workers' disks), else from the store's own
    commit manifests (an older checkpoint)."""
    if recorded is not None:
        return recorded.rows
    manifests, _ = scan_manifests(ckpt.store_path(rank, table) / "commits")
    return max((m.rows for m in manifests if m.name == ckpt.commit), default=0)

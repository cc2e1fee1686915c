"""Rows a run's stores already hold: what ``train --resume`` opens before it reads a log.

A resumed run, or one whose table came from ``daskhps import``, opens every rank's store at
the newest checkpoint's commit; its key index then holds every stored row, whatever the logs
use. Each store commit records its row count (:class:`daskhps.tiers.store.manifest.Manifest`), so
this reads one small JSON file per rank and never opens a store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from daskhps.tiers.store.manifest import scan_manifests

__all__ = ["StoredTable", "stored_table"]


@dataclass(frozen=True)
class StoredTable:
    """The table a resume would open: the checkpoint and each rank's stored rows."""

    checkpoint: str
    rows_per_rank: tuple[int, ...]

    @property
    def busiest(self) -> int:
        return max(self.rows_per_rank, default=0)


def stored_table(run_dir: str | Path) -> StoredTable | None:
    """The newest complete checkpoint of ``run_dir`` and its stores' rows, or None without one
    (a rank whose commit cannot be read counts 0: ``train --resume`` refuses it anyway)."""
    # Loaded here: training imports capacity (the trainer sizes the run before it starts).
    from daskhps.training.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir) if Path(run_dir).is_dir() else None
    if ckpt is None:
        return None
    rows = [0] * ckpt.num_workers
    for table in ckpt.table_names:  # a rank's rows: those of its store of every table
        for rank, recorded in enumerate(ckpt.recorded_commits(table)):
            if recorded is not None:  # what the checkpoint noted: the stores may be elsewhere
                rows[rank] += recorded.rows
                continue
            commits = ckpt.store_path(rank, table) / "commits"  # an older checkpoint
            manifests, _ = scan_manifests(commits)
            rows[rank] += max((m.rows for m in manifests if m.name == ckpt.commit), default=0)
    return StoredTable(ckpt.name, tuple(rows))

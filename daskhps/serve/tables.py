"""The serving lookup of a run with several embedding tables: one :class:`ServingLookup` per
table behind one ``keys -> rows`` of tagged keys.

::

    keys (every table's; table index in bits 56..62, daskhps.data.keyspace)
      ──split by key >> 56──► ServingLookup of table 0 ──► rows[:, :width 0]
                              ServingLookup of table 1 ──► rows[:, :width 1]   zeros beyond a
                              ...                                              table's width
    refresh(newer)            every table's lookup moves to the newer commit by its own delta

The rows come back padded to the widest table, as the trainer's replica looks them up
(:meth:`daskhps.distributed.WorkerShards.lookup_tagged`), so the model's input is built from
them the same way (:func:`daskhps.training.model_input.sparse_input` with ``field_columns``).

The cache budget (device rows, host bytes) is split over the tables by how many fields each
serves: a batch brings one key a field, so that is each table's share of a batch's keys.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from daskhps.data.keyspace import TABLE_SHIFT
from daskhps.errors import DataError, StoreMismatchError
from daskhps.serve.lookup import PreparedRefresh, RefreshReport, ServingLookup
from daskhps.serve.version import TableVersion
from daskhps.tiers.base import check_keys

__all__ = ["PreparedTables", "TablesLookup"]

_HOW = ("replay", "diff", "full")  # a table-by-table report says the most costly


@dataclass(frozen=True)
class PreparedTables:
    """:meth:`ServingLookup.prepare`'s result for every table, in table order."""

    tables: tuple[PreparedRefresh, ...]


def _shares(total: int, weights: Sequence[int], least: int) -> list[int]:
    """``total`` split by ``weights``, each share at least ``least``."""
    whole = sum(weights)
    return [max(least, total * w // whole) for w in weights]


class TablesLookup:
    """Read-only ``keys -> rows`` over several tables' versions (see the module docstring).

    Parameters
    ----------
    versions:
        Every table's version, in the run's table order (a key's table index picks one).
    fields:
        How many fields each table serves: its share of the caches. Default: equal shares.
    device_rows, host_bytes, device, policy, full_rows:
        As :class:`ServingLookup`'s, for all the tables together.
    """

    def __init__(
        self,
        versions: Sequence[TableVersion],
        *,
        device_rows: int,
        host_bytes: int = 0,
        device: str | torch.device = "cpu",
        policy: Literal["lru", "lfu"] = "lru",
        full_rows: bool = False,
        fields: Sequence[int] | None = None,
    ) -> None:
        weights = list(fields) if fields is not None else [1] * len(versions)
        if len(weights) != len(versions) or not versions:
            raise ValueError(f"{len(weights)} field counts for {len(versions)} tables")
        rows = _shares(device_rows, weights, 1)
        host = _shares(host_bytes, weights, 0)
        self.lookups: list[ServingLookup] = []
        try:
            for v, r, h in zip(versions, rows, host, strict=True):
                self.lookups.append(
                    ServingLookup(
                        v,
                        device_rows=r,
                        host_bytes=h,
                        device=device,
                        policy=policy,
                        full_rows=full_rows,
                    )
                )
        except BaseException:
            self.close()
            raise
        self.width = max(lk.width for lk in self.lookups)
        self.device = self.lookups[0].device

    @property
    def versions(self) -> tuple[TableVersion, ...]:
        return tuple(lk.version for lk in self.lookups)

    def lookup(self, keys: torch.Tensor, *, unique: bool = False) -> torch.Tensor:
        """Rows of int64 tagged ``keys`` (1-D; duplicates allowed unless ``unique``),
        ``float32[n, width]`` on :attr:`device`: each key's row from its table's lookup,
        zeros beyond that table's width."""
        keys = check_keys(keys, "serving lookup of several tables").to(self.device)
        out = torch.zeros((len(keys), self.width), dtype=torch.float32, device=self.device)
        if not len(keys):
            return out
        index = keys >> TABLE_SHIFT
        top = int(index.max())
        if top >= len(self.lookups) or int(index.min()) < 0:
            bad = int(keys[(index >= len(self.lookups)) | (index < 0)][0])
            raise DataError(
                f"serving lookup: key {bad} names table {bad >> TABLE_SHIFT}, but the model "
                f"has {len(self.lookups)} tables (0..{len(self.lookups) - 1}); make keys with "
                "the run's schema (cfg.data.schema.field_keys)"
            )
        for i, lk in enumerate(self.lookups):
            where = (index == i).nonzero().squeeze(1)
            if len(where):
                out[where, : lk.width] = lk.lookup(keys[where], unique=unique)
        return out

    def _check(self, versions: Sequence[TableVersion]) -> None:
        names = [v.spec.name for v in versions]
        if names != [v.spec.name for v in self.versions]:
            raise StoreMismatchError(
                f"no refresh from tables {[v.spec.name for v in self.versions]} to {names}: "
                "the tables differ; open a new lookup on the newer version instead"
            )

    def prepare(self, versions: Sequence[TableVersion]) -> PreparedTables:
        """:meth:`ServingLookup.prepare` of every table (nothing served changes)."""
        self._check(versions)
        done: list[PreparedRefresh] = []
        try:
            for lk, v in zip(self.lookups, versions, strict=True):
                done.append(lk.prepare(v))
        except BaseException:
            for p in done:
                p.stores.close()
            raise
        return PreparedTables(tuple(done))

    def refresh(self, versions: Sequence[TableVersion] | PreparedTables) -> RefreshReport:
        """Every table's :meth:`ServingLookup.refresh` to its newer version (or what
        :meth:`prepare` returned); one report of them all: the keys and rows summed, ``how``
        the most costly of the tables'. An error part-way (a store that cannot be read) can
        leave the tables before it moved: open a new lookup then."""
        t = time.perf_counter()
        targets: list[TableVersion | PreparedRefresh]
        if isinstance(versions, PreparedTables):
            targets = list(versions.tables)
        else:
            self._check(versions)
            targets = list(versions)
        reports = [lk.refresh(v) for lk, v in zip(self.lookups, targets, strict=True)]
        return RefreshReport(
            old_commit=reports[0].old_commit,
            new_commit=reports[0].new_commit,
            changed_keys=sum(r.changed_keys for r in reports),
            replaced_rows=sum(r.replaced_rows for r in reports),
            rows_read=sum(r.rows_read for r in reports),
            how=max((r.how for r in reports), key=_HOW.index),
            seconds=time.perf_counter() - t,
        )

    def stats(self) -> dict[str, Any]:
        """Where looked-up rows came from (every table's together), and each table's own
        :meth:`ServingLookup.stats` under ``tables``."""
        each = {lk.spec.name: lk.stats() for lk in self.lookups}
        rows_from: dict[str, int] = {}
        for s in each.values():
            for k, v in s["rows_from"].items():
                rows_from[k] = rows_from.get(k, 0) + int(v)
        total = sum(rows_from.values())
        return {
            "commit": self.lookups[0].version.commit,
            "rows_from": rows_from,
            "hit_rate": {k: v / total if total else 0.0 for k, v in rows_from.items()},
            "store_rows_read": sum(int(s["store_rows_read"]) for s in each.values()),
            "tables": each,
        }

    def close(self) -> None:
        for lk in self.lookups:
            lk.close()

    def __enter__(self) -> TablesLookup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

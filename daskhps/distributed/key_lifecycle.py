"""Which keys of one worker's tables get rows, and when rows leave: the admission and expiry
rules of :class:`~daskhps.distributed.WorkerShards` and the pending counts of the keys that
admission holds back (:mod:`daskhps.table.admission`, :mod:`daskhps.table.expiry`).

::

    stage a pass ─► admit (new keys: a row, or frozen and held back) ─► train
        ─► record_seen (rows' statistics; held keys' pending counts) ─► expire (a day ends)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from daskhps.distributed._errors import ClusterError
from daskhps.distributed.partition_columns import column_of, keys_of
from daskhps.table import EmbeddingTable
from daskhps.table.admission import AdmissionRule, PendingCounts, find_sorted
from daskhps.table.expiry import ExpiryRule

if TYPE_CHECKING:
    from daskhps.monitor import ShardMetrics

__all__ = ["KeyLifecycle"]


@dataclass(frozen=True)
class _PassAdmission:
    """What :meth:`KeyLifecycle.admit` decided for the pass being trained: the keys without
    rows it held back (sorted)."""

    held: np.ndarray


class KeyLifecycle:
    """The admission and expiry rules of one worker's tables (only those that do something),
    and the pending counts of each table's keys not admitted yet, committed with the shard's
    store and changed only by :meth:`record_seen` and :meth:`expire`.

    Every method works on one table, whose shard ``t`` its caller holds locked, and counts
    what it did in ``monitor`` (None: nowhere).
    """

    def __init__(
        self,
        names: Sequence[str],
        admission: AdmissionRule | Mapping[str, AdmissionRule] | None,
        expiry: ExpiryRule | Mapping[str, ExpiryRule] | None,
    ) -> None:
        self.admission: dict[str, AdmissionRule] = {}
        self.expiry: dict[str, ExpiryRule] = {}
        for name in names:
            a = admission.get(name) if isinstance(admission, Mapping) else admission
            e = expiry.get(name) if isinstance(expiry, Mapping) else expiry
            if a is not None and not a.admits_all:
                self.admission[name] = a
            if e is not None and e.expires:
                self.expiry[name] = e
        self.rank: int | None = None
        self.pending: dict[str, PendingCounts] = {}
        self._admitting: dict[str, _PassAdmission] = {}  # the pass admitted, until counted

    def bind(self, rank: int | None) -> None:
        """Start over on the worker of ``rank``: no table open yet."""
        self.rank = rank
        self.pending, self._admitting = {}, {}

    def load(self, table: str, t: EmbeddingTable) -> None:
        """Take the pending counts committed with a shard just opened."""
        store = t.store
        self.pending[table] = PendingCounts.from_arrays(
            store.attached(PendingCounts.KEYS), store.attached(PendingCounts.STATS)
        )

    def admit(
        self, table: str, t: EmbeddingTable, keys: Any, monitor: ShardMetrics | None
    ) -> dict[str, int]:
        """Freeze the keys of ``keys`` (a pass's owner partition, columns ``key`` and
        ``count``) that have no row and that the table's rule holds back this pass
        (:meth:`WorkerShards.admit`)."""
        rule = self.admission.get(table)
        if rule is None:
            return {"admitted": 0, "held_back": 0}
        k = keys_of(keys)
        new = t.without_rows(k).cpu().numpy()
        nkeys = k.cpu().numpy()[new]
        seen = column_of(keys, "count", torch.int64).numpy()[new]
        ok = rule.admitted(nkeys, self.pending[table].counts(nkeys), seen)
        t.freeze(torch.from_numpy(nkeys[~ok]))
        # sorted: an owner partition is in (virtual shard, key) order, not key order
        self._admitting[table] = _PassAdmission(held=np.sort(nkeys[~ok]))
        out = {"admitted": int(ok.sum()), "held_back": int((~ok).sum())}
        if monitor is not None:
            monitor.note_admitted(table, out["admitted"])
        return out

    def record_seen(
        self, table: str, t: EmbeddingTable, keys: Any, monitor: ShardMetrics | None
    ) -> None:
        """:meth:`WorkerShards.record_seen` of one table."""
        k = keys_of(keys)
        counts = column_of(keys, "count", torch.int64)
        days = column_of(keys, "day", torch.int32)
        pending = self.pending[table]
        passed = self._admitting.pop(table, None)
        if table in self.admission and passed is None:
            raise ClusterError(
                f"table {table!r} on rank {self.rank}: a pass was counted that was not "
                "admitted; call admit after staging it"
            )
        if passed is not None and len(passed.held):
            held = torch.from_numpy(find_sorted(passed.held, k.numpy())[1])
            pending.add(k[held].numpy(), counts[held].numpy(), days[held].numpy())
            k, counts, days = k[~held], counts[~held], days[~held]
        if len(pending):  # admitted now (or admission turned off): the count so far too
            counts = counts + torch.from_numpy(pending.pop(k.numpy()))
        t.record_seen(k, counts, days)
        t.thaw()
        if monitor is not None:
            monitor.note_pending(table, len(pending))

    def expire(
        self, table: str, t: EmbeddingTable, today: int, monitor: ShardMetrics | None
    ) -> dict[str, int]:
        """Remove the rows the table's rule expires on day ``today``, and the stale pending
        counts (:meth:`WorkerShards.expire`)."""
        rule = self.expiry.get(table)
        if rule is None:
            return {"expired": 0, "pending_expired": 0}
        keys, counts, days = t.row_statistics()
        gone = rule.expired(keys.numpy(), counts.numpy(), days.numpy(), today)
        removed = t.remove(keys[torch.from_numpy(gone)])
        pending = self.pending[table]
        stale = rule.stale(pending.stats[:, 1], today)
        pending.pop(pending.keys[stale])
        if monitor is not None:
            monitor.note_expired(table, removed, len(pending))
        return {"expired": removed, "pending_expired": int(stale.sum())}

    def attachment(self, table: str, t: EmbeddingTable) -> dict[str, np.ndarray] | None:
        """What a commit of the table's store attaches: the pending counts, only when there
        are any or were (a run without admission writes nothing more)."""
        pending = self.pending.get(table)
        carried = bool(t.store.attached_names) or (pending is not None and len(pending))
        return pending.arrays() if pending is not None and carried else None

    def figures(self, table: str) -> dict[str, int]:
        """The table's pending counts: how many keys, in how many bytes."""
        pending = self.pending.get(table, PendingCounts())
        return {"keys": len(pending), "bytes": pending.nbytes}

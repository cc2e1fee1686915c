"""Bytes each rank sends to and receives from the other ranks in a pass, against the least the
pass needs: counted on the workers, composed into the ``network`` record of ``metrics.jsonl``.

::

    every batch (collectives, daskhps.distributed.collective.Comm.traffic):
      keys    the per-owner key counts and the batch's unique keys, to their owners
      rows    the owners' rows, back to the requesters
      grads   the rows' gradients, to the owners
      dense   the dense gradients' all-reduce (a ring's bytes: a model, see Comm.all_reduce)
    every pass (Dask shuffles that prepare it, counted by the tasks that receive them):
      pass_keys  the pass's keys (deduplicated per partition), to their owners
      examples   the pass's examples, from the worker that read them to the one that trains them
    ──► RankTraffic (each rank, with its train_pass result) ──► network_record (the driver)

Nothing a rank sends to itself is counted: it never touches the network. A shuffle's piece
counts once per hop between two ranks: to the worker Dask's shuffle put the partition on,
and again when that worker is not the partition's rank and the partition is copied there.
Its bytes are the in-memory bytes of the rows' columns as they travel, not Dask's framing.

The least a pass needs (``min_sent``, ``min_received``), per rank ``r``, where ``U_r`` is the
set of unique keys of every example ``r`` trains in the pass and ``own(o)`` the keys rank
``o`` owns, ``R`` the bytes of a row (``dim * 4``) and ``n`` the ranks::

    keys      r sends 8 |U_r - own(r)|            and receives 8 sum_q!=r |U_q & own(r)|
    rows      r sends R sum_q!=r |U_q & own(r)|   and receives R |U_r - own(r)|
    grads     the reverse of rows
    dense     2 (n - 1) / n of the dense parameters' bytes, each way, per batch
    pass_keys, examples   each row once, from the rank that read it to the rank that needs it

so each remote row the pass uses crosses to each rank that uses it once, and its gradient
once back. The exchange sends a row every batch it is used in, and its key counts besides:
``ratio`` (measured / least) says what that costs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "BATCH_KINDS",
    "KINDS",
    "PASS_KINDS",
    "SOURCE",
    "PassKeys",
    "RankTraffic",
    "RouteAccount",
    "account_shuffled",
    "forget_routed",
    "network_record",
    "take_routed",
]

BATCH_KINDS = ("keys", "rows", "grads", "dense")
PASS_KINDS = ("pass_keys", "examples")
KINDS = BATCH_KINDS + PASS_KINDS
KEY_BYTES = 8
SOURCE = "daskhps_from"  # the rank that sent a shuffled row (-1: a worker outside the run)


@dataclass(frozen=True)
class RouteAccount:
    """Where a pass's shuffles count their bytes: the run (``token``), the pass (its
    ``position`` in the schedule) and the ranks' worker addresses."""

    token: str
    position: int
    addresses: tuple[str, ...]

    def rank_here(self) -> int:
        """The rank of the worker running the current task (-1: none of the run's, or not
        in a Dask task)."""
        address = _worker_address()
        return self.addresses.index(address) if address in self.addresses else -1


def _worker_address() -> str | None:
    from distributed import get_worker

    try:
        return str(get_worker().address)
    except ValueError:  # not inside a Dask task
        return None


# (token, position, worker address) -> kind -> (hops, least): n x n byte matrices,
# [from rank, to rank], recorded by the tasks that ran on that worker
_ROUTED: dict[tuple[str, int, str], dict[str, tuple[np.ndarray, np.ndarray]]] = {}
_LOCK = threading.Lock()


def _row_bytes(df: pd.DataFrame) -> np.ndarray | int:
    """Bytes of each row of ``df`` as its columns and index hold them: an int when every
    column is of fixed width, else an array (binary columns: their values' lengths)."""
    fixed, varying = 0, []
    for col in [df.index.to_series(), *(df[c] for c in df.columns)]:
        dtype = col.dtype
        if isinstance(dtype, pd.ArrowDtype):
            t = dtype.pyarrow_dtype
            if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t):
                arr = pa.array(col.array, from_pandas=True)
                lengths = np.asarray(pc.fill_null(pc.binary_length(arr), 0), dtype=np.int64)
                varying.append(lengths)
                fixed += 8 if pa.types.is_large_binary(t) else 4  # the offset
                continue
            fixed += max(getattr(t, "bit_width", 64) // 8, 1)
        else:
            fixed += int(getattr(dtype, "itemsize", 8))  # object columns: a pointer (undercount)
    if not varying:
        return fixed
    return fixed + np.sum(varying, axis=0)


def account_shuffled(
    account: RouteAccount | None, kind: str, df: pd.DataFrame, partition: int
) -> pd.DataFrame:
    """Count the rows of a shuffle's output partition ``partition`` (owned by that rank) that
    came from other ranks (their :data:`SOURCE` column), and the copy to the partition's rank
    when this worker is not that rank; returns ``df`` without the column. Runs in the task
    that receives the shuffle's output."""
    if SOURCE not in df.columns:
        return df
    if account is None or not len(df):
        return df.drop(columns=[SOURCE])
    n = len(account.addresses)
    here = account.rank_here()
    source = df[SOURCE].to_numpy().astype(np.int64)
    per_row = _row_bytes(df)
    if isinstance(per_row, int):
        from_rank = np.bincount(source + 1, minlength=n + 1)[1:] * per_row
    else:
        from_rank = np.bincount(source + 1, weights=per_row, minlength=n + 1)[1:].astype(np.int64)
    out = df.drop(columns=[SOURCE])
    total = int(from_rank.sum())
    hops = np.zeros((n, n), dtype=np.int64)
    least = np.zeros((n, n), dtype=np.int64)
    least[:, partition] = from_rank
    if here >= 0:
        hops[:, here] = from_rank  # the shuffle's hop: to this worker
        if here != partition:
            hops[here, partition] += total  # the partition is copied to its rank
    else:  # a worker outside the run: only the hop to the partition's rank is known
        hops[:, partition] = from_rank
    np.fill_diagonal(hops, 0)
    np.fill_diagonal(least, 0)
    address = _worker_address() or ""
    with _LOCK:
        kinds = _ROUTED.setdefault((account.token, account.position, address), {})
        if kind in kinds:
            h, le = kinds[kind]
            kinds[kind] = (h + hops, le + least)
        else:
            kinds[kind] = (hops, least)
    return out


def take_routed(
    token: str, position: int, address: str
) -> dict[str, tuple[list[list[int]], list[list[int]]]]:
    """The shuffle bytes recorded on worker ``address`` for pass ``position`` of run
    ``token`` (``{kind: (hops, least)}``, n x n lists by [from rank][to rank]), forgotten."""
    with _LOCK:
        got = _ROUTED.pop((token, position, address), {})
    return {k: (h.tolist(), le.tolist()) for k, (h, le) in got.items()}


def forget_routed(token: str) -> None:
    """Drop what a run's passes recorded and never took (a run stopped between passes)."""
    with _LOCK:
        for key in [k for k in _ROUTED if k[0] == token]:
            del _ROUTED[key]


class PassKeys:
    """The unique keys of a rank's batches over a pass, by owner: each batch's routed keys
    (unique in the batch, grouped by owner) are kept, and the distinct ones of each owner
    counted once at the pass's end.

    Nothing is hashed again (the routing knows each key's owner), and what is deduplicated at
    the end is the batches' unique keys, not every key of the pass: on the CPU by a hash
    table (``pandas.unique``), the cheapest way to count distinct values."""

    def __init__(self) -> None:
        self._parts: list[list[Any]] = []  # [owner] -> that owner's keys of every batch

    def add(self, keys: Any, counts: Sequence[int]) -> None:
        """A batch's unique keys, grouped by owner rank: ``counts[o]`` of them are rank o's."""
        import torch

        while len(self._parts) < len(counts):
            self._parts.append([])
        for o, part in enumerate(torch.split(keys.reshape(-1), list(counts))):
            if len(part):
                self._parts[o].append(part)

    def by_owner(self, world_size: int) -> list[int]:
        """How many distinct keys of the pass each rank owns."""
        import torch

        out = [0] * world_size
        for o, parts in enumerate(self._parts[:world_size]):
            if not parts:
                continue
            keys = torch.cat(parts)
            if keys.device.type == "cpu":
                out[o] = int(pd.unique(keys.numpy()).size)
            else:
                out[o] = int(torch.unique(keys).numel())
        return out


@dataclass
class RankTraffic:
    """One rank's network figures of one pass (returned with its ``train_pass`` result).

    ``sent``/``received``: bytes of the collectives by kind; ``owners[o]``: the unique keys
    of the rank's examples that rank ``o`` owns; ``routed``: the shuffles' byte matrices
    recorded on this rank's worker (``{kind: (hops, least)}``)."""

    sent: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)
    owners: list[int] = field(default_factory=list)
    row_bytes: int = 0
    dense_bytes: int = 0
    batches: int = 0
    routed: dict[str, tuple[list[list[int]], list[list[int]]]] = field(default_factory=dict)


def _ring(nbytes: int, n: int) -> int:
    return 2 * (n - 1) * nbytes // n if n > 1 else 0


def network_record(ranks: Sequence[RankTraffic]) -> dict[str, Any]:
    """The ``network`` record of a pass from every rank's figures (rank order): for each
    kind, and their ``total``, the bytes sent and received summed over ranks, the busiest
    rank's, the least the pass needs and the ratio of the two, and each rank's figures."""
    n = len(ranks)
    owners = np.array([r.owners or [0] * n for r in ranks], dtype=np.int64).reshape(n, n)
    np.fill_diagonal(owners, 0)
    asks, serves = owners.sum(axis=1), owners.sum(axis=0)  # remote keys: used, served
    row = max((r.row_bytes for r in ranks), default=0)
    dense = max((r.dense_bytes for r in ranks), default=0)
    batches = max((r.batches for r in ranks), default=0)
    ring = np.full(n, batches * _ring(dense, n), dtype=np.int64)
    least: dict[str, tuple[np.ndarray, np.ndarray]] = {
        "keys": (asks * KEY_BYTES, serves * KEY_BYTES),
        "rows": (serves * row, asks * row),
        "grads": (asks * row, serves * row),
        "dense": (ring, ring),
    }
    measured: dict[str, tuple[np.ndarray, np.ndarray]] = {
        k: (
            np.array([r.sent.get(k, 0) for r in ranks], dtype=np.int64),
            np.array([r.received.get(k, 0) for r in ranks], dtype=np.int64),
        )
        for k in BATCH_KINDS
    }
    for kind in PASS_KINDS:
        hops = np.zeros((n, n), dtype=np.int64)
        once = np.zeros((n, n), dtype=np.int64)
        for r in ranks:
            if kind in r.routed:
                h, le = r.routed[kind]
                hops += np.asarray(h, dtype=np.int64).reshape(n, n)
                once += np.asarray(le, dtype=np.int64).reshape(n, n)
        measured[kind] = (hops.sum(axis=1), hops.sum(axis=0))
        least[kind] = (once.sum(axis=1), once.sum(axis=0))
    out: dict[str, Any] = {"ranks": n, "batches": batches}
    zero = np.zeros(n, dtype=np.int64)
    totals = [zero.copy() for _ in range(4)]
    for kind in KINDS:
        figures = (*measured[kind], *least[kind])
        out[kind] = _figures(*figures)
        for t, f in zip(totals, figures, strict=True):
            t += f
    out["total"] = _figures(*totals)
    return out


def _figures(
    sent: np.ndarray, received: np.ndarray, min_sent: np.ndarray, min_received: np.ndarray
) -> dict[str, Any]:
    total, least = int(sent.sum()), int(min_sent.sum())
    return {
        "sent": total,
        "received": int(received.sum()),
        "max_sent": int(sent.max(initial=0)),
        "max_received": int(received.max(initial=0)),
        "min": least,
        "max_min": int(max(min_sent.max(initial=0), min_received.max(initial=0))),
        "ratio": round(total / least, 4) if least else None,
        "rank_sent": sent.tolist(),
        "rank_received": received.tolist(),
        "rank_min_sent": min_sent.tolist(),
        "rank_min_received": min_received.tolist(),
    }

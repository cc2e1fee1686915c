"""Re-sharding a checkpoint's stores on the workers that hold them: rows go worker to worker.

A run that continues on another number of workers needs its table in ``W`` new rank stores,
each row with the new owner of its virtual shard (``ShardMap(num_shards, W)``). Every old rank
store lies on the disk of one of the new workers (its *holder*); no store is ever opened by
the driver, which may not see those disks at all. Example: 2 old ranks onto 3 workers, old
rank 0 held by new rank 1 and old rank 1 by new rank 2::

    driver: check holders; every rank checks out_dir on its own disk (no published version)
    rank 0 (holds nothing)      rank 1 (holds old 0)          rank 2 (holds old 1)
      all_reduce: blocks each rank reads, pending counts, ...  -> rounds = the largest
      round i: each rank groups its i-th block of keys by new owner (none past its last
               block), reads their rows --- all_to_all_single: counts, keys, rows --->
               each owner upserts what it got
      the same for the pending counts of keys not admitted yet (a key, its count and day)
      commit <out_dir>/<table>/rank-<j> as ckpt.commit, pending counts attached
    (with several tables: all of the above for each table in turn, every rank in the same
    order; a key's new owner is ShardMap(num_shards, W) of the full key, table bits included)

A block is ``block_rows`` keys of one old store, in a random order (:func:`_spread` says
why), grouped by new owner before their rows are read: the rows the store hands back are the
message as they are, and arrive bit for bit (the collective copies bytes). What a rank keeps
at once is the block it reads and the rows sent to it in that round (``block_rows`` from each
rank at most; about ``block_rows`` in all, owners being uniform over keys), besides the old
stores' key indexes and their pending counts. The result is the one
:func:`daskhps.training.resume.reshard` writes on the driver: the same keys, rows and pending
counts in every new rank store, under the same commit name and meta.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from daskhps._text import counted
from daskhps.distributed._pinned import run_pinned
from daskhps.distributed.collective import Comm
from daskhps.distributed.host import RunGroup, RunHost
from daskhps.errors import ResumeError
from daskhps.sharding import ShardMap
from daskhps.table import open_shard_store
from daskhps.table.admission import PendingCounts
from daskhps.tiers.lock import WriterLock

if TYPE_CHECKING:
    from daskhps.runfiles.checkpoint import Checkpoint
    from daskhps.tiers.store import StoreReader

__all__ = ["BLOCK_ROWS", "RankReshard", "ReshardReport", "reshard_on_workers"]

log = logging.getLogger(__name__)

BLOCK_ROWS = 1 << 16  # rows a rank reads and sends per round: 51 MB of dim-64 Adam rows
_LOCK_WAIT_S = 30.0


@dataclass(frozen=True)
class RankReshard:
    """What one new rank did.

    Attributes
    ----------
    rank, address:
        The new rank and its worker.
    old_ranks:
        The old rank stores it read (those it holds).
    rows_read, rows_written:
        Rows read from its old stores; rows written into its new store.
    rows_sent:
        Rows read here whose new owner is another rank (they crossed the network).
    pending_read, pending_written:
        Pending counts (keys not admitted yet) read, and attached to its new store.
    bytes_sent, bytes_received:
        Bytes of the all-to-all messages to and from other ranks (its messages to itself
        excluded): rows, pending counts and the per-round counts.
    rounds:
        All-to-all rounds it took part in (rows, then pending counts).
    seconds:
        Its task's time, from opening the stores to the commit.
    cpu_seconds:
        CPU time its worker process used meanwhile (every thread: the task's, the process
        group's transfers, Dask's).
    min_bytes:
        The least it could have sent: each row sent to another rank, with its key (a row is
        as wide as its table's).
    """

    rank: int
    address: str
    old_ranks: tuple[int, ...]
    rows_read: int
    rows_written: int
    rows_sent: int
    pending_read: int
    pending_written: int
    bytes_sent: int
    bytes_received: int
    rounds: int
    seconds: float
    cpu_seconds: float
    min_bytes: int = 0


@dataclass(frozen=True)
class ReshardReport:
    """A re-shard on the workers, in figures.

    Attributes
    ----------
    out_dir:
        Where each new rank store is, on its worker's disk.
    from_workers, to_workers:
        Old and new worker counts.
    rows:
        Rows written into the new stores (every row of the checkpoint).
    seconds:
        The whole call: checks, process group, re-shard.
    row_bytes:
        Bytes of one row (the store's float32 columns: embedding, optimizer state, stats);
        with several tables, the widest table's.
    ranks:
        Each new rank's :class:`RankReshard`, in rank order.
    """

    out_dir: Path
    from_workers: int
    to_workers: int
    rows: int
    seconds: float
    row_bytes: int
    ranks: tuple[RankReshard, ...]

    @property
    def bytes_moved(self) -> int:
        """Bytes sent over the network, by every rank (messages to itself excluded)."""
        return sum(r.bytes_sent for r in self.ranks)

    @property
    def rows_moved(self) -> int:
        """Rows whose new owner is not the worker that held them."""
        return sum(r.rows_sent for r in self.ranks)

    @property
    def min_bytes(self) -> int:
        """The least any re-shard sends: each row that changes worker, with its key."""
        return sum(r.min_bytes for r in self.ranks)

    @property
    def cpu_seconds(self) -> float:
        """CPU time of every rank's worker process during its task, summed."""
        return sum(r.cpu_seconds for r in self.ranks)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def reshard_on_workers(
    client: Any,
    ckpt: Checkpoint,
    holders: Mapping[int, str],
    addresses: Sequence[str],
    out_dir: Path,
    *,
    block_rows: int = BLOCK_ROWS,
    timeout_s: float = 60.0,
) -> ReshardReport:
    """Write the rows of ``ckpt``'s stores into ``len(addresses)`` new rank stores, new rank
    ``j`` at ``<out_dir>/<table>/rank-<j>`` on the disk of worker ``addresses[j]``, each
    committed as ``ckpt.commit``; rows and pending counts move between the workers, never
    through the driver.

    Parameters
    ----------
    client:
        A Dask client of the cluster that holds ``addresses``.
    ckpt:
        The checkpoint whose stores are re-sharded, read at its commit and never changed.
    holders:
        For each old rank ``r`` (``0 .. ckpt.num_workers - 1``), the worker, one of
        ``addresses``, on whose disk ``ckpt.store_path(r)`` is; one worker may hold several.
    addresses:
        The new workers in rank order.
    out_dir:
        The new stores' folder on every new worker's disk. Rank stores there from an earlier
        attempt are replaced; stores holding a published version are refused.
    block_rows:
        Rows each rank reads and sends per round.
    timeout_s:
        Forming the process group, and the longest a rank waits in a collective.

    Raises
    ------
    ResumeError
        One line naming the rank and the worker: an old rank without a holder, a holder that
        is not one of ``addresses``, an old store missing on its holder's disk, a new store
        still locked by another writer, or published versions under ``out_dir``; also
        ``out_dir`` being the checkpoint's own stores folder.
    """
    t0 = time.perf_counter()
    addresses = list(addresses)
    out_dir = Path(out_dir)
    _check_request(ckpt, addresses, out_dir, block_rows)
    rank_args = [(h,) for h in _held_ranks(ckpt, holders, addresses)]
    _check_workers(client, ckpt, addresses, out_dir, rank_args)
    with RunGroup.start(client, addresses, timeout_s=timeout_s) as group:
        done = group.run(
            _reshard_rank, ckpt, out_dir, block_rows, rank_args=rank_args, what="re-shard"
        )
    ranks = tuple(r for r in done if r is not None)
    if len(ranks) != len(addresses):  # a rank that failed raised: the others return None
        raise ResumeError(f"cannot re-shard {ckpt.name}: a rank stopped without a report")
    report = ReshardReport(
        out_dir=out_dir,
        from_workers=ckpt.num_workers,
        to_workers=len(addresses),
        rows=sum(r.rows_written for r in ranks),
        seconds=time.perf_counter() - t0,
        row_bytes=max(s.row_bytes for s in ckpt.table_specs),
        ranks=ranks,
    )
    log.info(
        "re-sharded %d rows of %s from %d to %d workers into %s on the workers in %.1f s "
        "(%d bytes over the network, %d at least)",
        *(report.rows, ckpt.name, ckpt.num_workers, len(addresses), out_dir, report.seconds),
        *(report.bytes_moved, report.min_bytes),
    )
    return report


def _check_request(ckpt: Checkpoint, addresses: list[str], out_dir: Path, block_rows: int) -> None:
    """:class:`ResumeError` for what the arguments alone rule out."""
    if not addresses or len(set(addresses)) != len(addresses):
        raise ResumeError(
            f"cannot re-shard {ckpt.name}: the new workers must be distinct and at least one, "
            f"got {addresses}"
        )
    if block_rows < 1:
        raise ResumeError(f"cannot re-shard {ckpt.name}: block_rows must be >= 1, got {block_rows}")
    if os.path.abspath(out_dir) == os.path.abspath(ckpt.stores_dir):
        raise ResumeError(
            f"cannot re-shard {ckpt.name} into {out_dir}: its own stores are there, and the "
            "new ones would replace them while they are read; give another folder"
        )
    ShardMap(ckpt.num_shards, len(addresses))  # refuses more workers than virtual shards


def _check_workers(
    client: Any,
    ckpt: Checkpoint,
    addresses: list[str],
    out_dir: Path,
    rank_args: list[tuple[list[int]]],
) -> None:
    """:class:`ResumeError` for the first new rank whose worker cannot take part
    (:func:`_check_rank` on every worker at once)."""
    problems = run_pinned(
        client, addresses, _check_rank, ckpt, out_dir, rank_args=rank_args, what="re-shard check"
    )
    for j, problem in enumerate(problems):
        if problem is not None:
            raise ResumeError(
                f"cannot re-shard {ckpt.name} on worker {addresses[j]} (new rank {j}): {problem}"
            )


def _held_ranks(
    ckpt: Checkpoint, holders: Mapping[int, str], addresses: Sequence[str]
) -> list[list[int]]:
    """The old ranks each new rank holds; :class:`ResumeError` naming a rank without one."""
    where = {a: j for j, a in enumerate(addresses)}
    held: list[list[int]] = [[] for _ in addresses]
    for r in range(ckpt.num_workers):
        if r not in holders:
            raise ResumeError(
                f"cannot re-shard {ckpt.name}: old rank {r} has no holder among the workers "
                f"{list(addresses)}; restore its store ({ckpt.store_path(r)}) onto one of them "
                "from the checkpoint's copy first"
            )
        if holders[r] not in where:
            raise ResumeError(
                f"cannot re-shard {ckpt.name}: old rank {r} is held by worker {holders[r]}, "
                f"which is not one of the new workers {list(addresses)}"
            )
        held[where[holders[r]]].append(r)
    extra = sorted(set(holders) - set(range(ckpt.num_workers)))
    if extra:
        raise ResumeError(
            f"cannot re-shard {ckpt.name}: it has {counted(ckpt.num_workers, 'rank')}, but "
            "holders names "
            f"rank(s) {extra} (on {[holders[r] for r in extra]})"
        )
    return held


# -- on each worker ------------------------------------------------------------------------


def _check_rank(held: list[int], ckpt: Checkpoint, out_dir: Path) -> str | None:
    """On a new rank's worker, before anything is written: what stops the re-shard there (a
    missing old store, published versions under ``out_dir``, a new store still locked by
    another writer), or None."""
    from daskhps.runfiles.rundir import published_commits  # the trainer's module: not at import

    for r in held:
        for path in ckpt.rank_stores(r):
            if not path.is_dir():
                return (
                    f"the store of old rank {r} ({path}) is not on this worker's disk; "
                    "restore it from the checkpoint's copy first"
                )
    versions = published_commits(out_dir)
    if versions:  # the re-shard replaces the stores there: never a published version's
        return (
            f"the stores in {out_dir} hold published versions ({', '.join(versions)}); "
            f"resume on {counted(ckpt.num_workers, 'worker')} instead"
        )
    deadline = time.monotonic() + _LOCK_WAIT_S
    for table in ckpt.table_names:
        for old in sorted((out_dir / table).glob("rank-*")):  # an earlier attempt's
            refused = WriterLock(old, f"re-sharded store {table}/{old.name}").wait_free(deadline)
            if refused is not None:
                return f"{refused} (still held after {_LOCK_WAIT_S:g} s)"
    return None


def _reshard_rank(
    host: RunHost, ckpt: Checkpoint, out_dir: Path, block_rows: int, held: list[int]
) -> RankReshard | None:
    """New rank ``host.rank``'s part: for every table in turn, send the rows of the old stores
    it holds to their new owners, write those sent to it, commit. Every rank runs the same
    collectives, in the same order; a rank that cannot open its stores raises, and the others
    return None."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    comm = host.require_comm()
    done = []
    for table in ckpt.table_names:
        one = _reshard_table(comm, ckpt, table, out_dir, block_rows, held)
        if one is None:
            return None  # another rank could not open its stores: its task says why
        done.append(one)
    return RankReshard(
        rank=comm.rank,
        address=host.addresses[comm.rank],
        old_ranks=tuple(held),
        rows_read=sum(d.stream.rows_read for d in done),
        rows_written=sum(d.rows_written for d in done),
        rows_sent=sum(d.rows_sent for d in done),
        pending_read=sum(d.pending_read for d in done),
        pending_written=sum(d.stream.received for d in done),
        bytes_sent=sum(d.stream.bytes_sent for d in done),
        bytes_received=sum(d.stream.bytes_received for d in done),
        rounds=sum(d.stream.rounds for d in done),
        seconds=time.perf_counter() - t0,
        cpu_seconds=time.process_time() - cpu0,
        min_bytes=sum(d.rows_sent * (d.row_bytes + 8) for d in done),
    )


@dataclass(frozen=True)
class _TableDone:
    """One table's part of a rank's re-shard."""

    stream: _Stream
    rows_written: int
    rows_sent: int
    pending_read: int
    row_bytes: int


def _reshard_table(
    comm: Comm, ckpt: Checkpoint, table: str, out_dir: Path, block_rows: int, held: list[int]
) -> _TableDone | None:
    """One table of :func:`_reshard_rank`: its rows, then its pending counts, then the commit
    of the new rank store ``<out_dir>/<table>/rank-<j>``; None when another rank failed."""
    rank, world = comm.rank, comm.world_size
    spec = ckpt.spec_of(table)
    new_map = ShardMap(ckpt.num_shards, world)
    with ExitStack() as stack:
        failed: BaseException | None = None
        srcs: list[StoreReader] = []
        try:
            for r in held:
                srcs.append(stack.enter_context(ckpt.open_store(r, table=table)))
            dst = stack.enter_context(
                open_shard_store(spec, out_dir / table / f"rank-{rank}", mode="w", overwrite=True)
            )
            pending = PendingCounts.merged(
                [
                    PendingCounts.from_arrays(
                        s.attached(PendingCounts.KEYS), s.attached(PendingCounts.STATS)
                    )
                    for s in srcs
                ]
            )
            keys = [_spread(s.keys()) for s in srcs]
        except Exception as e:  # every rank must still take part in the agreement below
            failed, keys, pending = e, [], PendingCounts()
        row_blocks = sum(-(-int(k.shape[0]) // block_rows) for k in keys)
        pending_blocks = -(-len(pending) // block_rows)
        carried = any(s.attached_names for s in srcs)
        agree = torch.zeros(4, world, dtype=torch.int64)  # summed: each rank fills its column
        agree[:, rank] = torch.tensor([row_blocks, pending_blocks, carried, failed is not None])
        comm.all_reduce(agree)
        if failed is not None:
            raise failed
        if bool(agree[3].any()):
            return None
        stream = _Stream(comm, new_map)
        for src, ks in zip(srcs, keys, strict=True):
            for a in range(0, int(ks.shape[0]), block_rows):
                part, _, counts = stream.by_owner(ks[a : a + block_rows])
                got_keys, got = stream.round(part, src.lookup(part).rows, counts)
                dst.upsert(got_keys, got)
                stream.rows_read += int(part.shape[0])
        for _ in range(row_blocks, int(agree[0].max())):  # others still send: take part
            part, _, counts = stream.by_owner(torch.empty(0, dtype=torch.int64))
            got_keys, got = stream.round(part, torch.empty(0, spec.width), counts)
            dst.upsert(got_keys, got)
        rows_written, rows_sent = stream.received, stream.sent_away
        stream.received = stream.sent_away = 0
        parts: list[PendingCounts] = []
        for a in range(0, int(agree[1].max()) * block_rows, block_rows):
            part, order, counts = stream.by_owner(
                torch.from_numpy(pending.keys[a : a + block_rows])
            )
            stats = torch.from_numpy(pending.stats[a : a + block_rows])[order]
            got_keys, got = stream.round(part, stats, counts)
            at = torch.argsort(got_keys)  # each sender's keys are sorted, not all together
            parts.append(PendingCounts(got_keys[at].numpy(), got[at].numpy()))
        attach = PendingCounts.merged(parts).arrays() if bool(agree[2].any()) else None
        meta = {"checkpoint": ckpt.commit, "resharded_from": ckpt.num_workers}
        dst.commit(ckpt.commit, meta, attach)
    return _TableDone(stream, rows_written, rows_sent, len(pending), spec.row_bytes)


def _spread(keys: torch.Tensor) -> torch.Tensor:
    """``keys`` in a random order (fixed seed). A store lists its keys in the order of its
    hash index, so a block of consecutive ones covers a narrow range of that hash, and the
    new store's index, hashing the same way, would crowd a round's keys into a few of its
    buckets: a block of 65,536 keys took 30 s to insert instead of 0.2 s."""
    g = torch.Generator().manual_seed(0)
    return keys[torch.randperm(int(keys.shape[0]), generator=g)]


class _Stream:
    """The all-to-all rounds of one rank: each round sends keys with their rows to the keys'
    new owners and returns what was sent here; counts what crossed the network."""

    def __init__(self, comm: Comm, new_map: ShardMap) -> None:
        self.comm = comm
        self.new_map = new_map
        self.rank = comm.rank
        self.world = comm.world_size
        self.ones = [1] * self.world
        self.rows_read = self.received = self.sent_away = 0
        self.bytes_sent = self.bytes_received = self.rounds = 0

    def by_owner(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``keys`` grouped by new owner (stable), the order that groups them, and how many
        go to each rank."""
        owner = self.new_map.worker(keys)
        order = torch.argsort(owner, stable=True)
        return keys[order], order, torch.bincount(owner, minlength=self.world)

    def round(
        self, keys: torch.Tensor, rows: torch.Tensor, send: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Send ``keys`` (grouped by owner, ``send[j]`` of them to rank ``j``) and their
        ``rows``; returns the keys and rows sent to this rank, rank by rank."""
        recv = torch.empty_like(send)
        self.comm.all_to_all_single(recv, send, self.ones, self.ones)
        send_l, recv_l = send.tolist(), recv.tolist()
        n, m = int(keys.shape[0]), sum(recv_l)
        got_keys = torch.empty(m, dtype=torch.int64)
        self.comm.all_to_all_single(got_keys, keys, recv_l, send_l)
        got = rows.new_empty((m, *rows.shape[1:]))
        self.comm.all_to_all_single(got, rows.contiguous(), recv_l, send_l)
        row = 8 + int(rows.shape[1]) * rows.element_size()
        counts = 8 * (self.world - 1)  # each round's counts to (and from) every other rank
        self.sent_away += n - send_l[self.rank]
        self.received += m
        self.bytes_sent += (n - send_l[self.rank]) * row + counts
        self.bytes_received += (m - recv_l[self.rank]) * row + counts
        self.rounds += 1
        return got_keys, got

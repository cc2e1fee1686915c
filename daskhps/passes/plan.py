"""The pass plan: which examples make up each pass, each global batch and each worker's share.

The plan is a pure function of (input files, pass config, number of workers, seed). It never
looks at tier sizes; ``max_working_set`` is a config value.

::

    plan positions  0                                                          N
    passes          | pass 0: examples_per_pass | pass 1           | ... | last (short) |
    one pass        | batch 0: B | batch 1: B | ...                | batch k (<= B)  |
    one batch       | worker 0 | worker 1 | ... | worker W-1 |      (sizes differ by <= 1)

A plan position is an example's place in the input: files in sorted path order, lines in file
order. With ``shuffle_examples`` each pass's examples are permuted (by a seed derived from the
plan seed and the pass index) before they are cut into batches; the pass still holds the same
examples.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask
import numpy as np

from daskhps.data.readers import ClickLog
from daskhps.data.source import day_of
from daskhps.errors import CapacityError, ConfigError
from daskhps.passes.config import PassConfig
from daskhps.passes.keys import pass_keys

__all__ = [
    "PassPlan",
    "PassSpec",
    "bad_rows_by_pass",
    "build_plan",
    "day_ends",
    "split_batch",
    "warn_rereads",
]

log = logging.getLogger(__name__)


def split_batch(size: int, num_workers: int) -> np.ndarray:
    """Boundaries of each worker's share of a batch of ``size`` (length ``num_workers + 1``).

    ::

        size 10, 4 workers -> [0, 3, 6, 8, 10]    shares 3 3 2 2
    """
    base, extra = divmod(size, num_workers)
    shares = np.full(num_workers, base, dtype=np.int64)
    shares[:extra] += 1
    return np.concatenate([[0], np.cumsum(shares)])


@dataclass(frozen=True)
class PassSpec:
    """One pass: plan positions ``[start, stop)`` trained in global batches over W workers.

    ``index`` counts passes in plan order (sub-passes made by ``max_working_set`` count as
    passes). ``seed`` permutes the examples when ``shuffled``.
    """

    index: int
    start: int
    stop: int
    global_batch_size: int
    num_workers: int
    seed: int
    shuffled: bool = False

    @property
    def num_examples(self) -> int:
        return self.stop - self.start

    @property
    def num_batches(self) -> int:
        return -(-self.num_examples // self.global_batch_size)

    def order(self) -> np.ndarray:
        """Plan positions of the pass in training order."""
        pos = np.arange(self.start, self.stop, dtype=np.int64)
        if self.shuffled:
            np.random.default_rng(self.seed).shuffle(pos)
        return pos

    def batch(self, b: int) -> np.ndarray:
        """Plan positions of global batch ``b``."""
        if not 0 <= b < self.num_batches:
            raise IndexError(f"pass {self.index} has {self.num_batches} batches, not {b}")
        lo = b * self.global_batch_size
        return self.order()[lo : lo + self.global_batch_size]

    def worker_batch(self, b: int, worker: int) -> np.ndarray:
        """Plan positions worker ``worker`` trains in global batch ``b``."""
        ids = self.batch(b)
        bounds = split_batch(len(ids), self.num_workers)
        return ids[bounds[worker] : bounds[worker + 1]]

    def worker_examples(self, worker: int) -> list[np.ndarray]:
        """Every batch's share of ``worker``, in order (one array per global batch)."""
        order = self.order()
        B = self.global_batch_size
        out = []
        for lo in range(0, len(order), B):
            ids = order[lo : lo + B]
            bounds = split_batch(len(ids), self.num_workers)
            out.append(ids[bounds[worker] : bounds[worker + 1]])
        return out


@dataclass(frozen=True)
class PassPlan:
    """All passes of one input. ``partition_lengths[i]`` is the number of good rows of
    partition ``i``, which reads file ``files[i]`` (a large plain-text file is read in blocks,
    so its path repeats, once per block): together they map plan positions to partitions."""

    passes: tuple[PassSpec, ...]
    files: tuple[str, ...]
    partition_lengths: tuple[int, ...]
    config: PassConfig
    num_workers: int
    seed: int

    @property
    def num_examples(self) -> int:
        return int(sum(self.partition_lengths))

    def passes_per_partition(self) -> np.ndarray:
        """How many passes read each partition (a pass reads every partition it overlaps)."""
        lengths = np.asarray(self.partition_lengths, dtype=np.int64)
        ends = np.cumsum(lengths)
        begins = ends - lengths
        starts = np.array([p.start for p in self.passes], dtype=np.int64)
        stops = np.array([p.stop for p in self.passes], dtype=np.int64)
        first = np.searchsorted(stops, begins, side="right")  # first pass ending after begin
        last = np.searchsorted(starts, ends, side="left")  # passes starting before end
        return np.where(lengths > 0, np.maximum(last - first, 0), 0)

    def pass_days(self) -> list[tuple[int, int] | None]:
        """The first and last log day (``date.toordinal()``) of each pass's rows, from the
        ``day=YYYY-MM-DD`` folders of the files it reads; None for a pass with a file outside
        any such folder."""
        file_day = [_day_number(f) for f in self.files]
        ends = np.cumsum(np.asarray(self.partition_lengths, dtype=np.int64))
        begins = ends - np.asarray(self.partition_lengths, dtype=np.int64)
        out: list[tuple[int, int] | None] = []
        for p in self.passes:
            # partitions holding at least one row of [start, stop)
            parts = np.flatnonzero((begins < p.stop) & (ends > p.start))
            days = [file_day[i] for i in parts]
            if not days or any(d is None for d in days):
                out.append(None)
            else:
                known = [d for d in days if d is not None]
                out.append((min(known), max(known)))
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "examples": self.num_examples,
            "passes": len(self.passes),
            "workers": self.num_workers,
            "global_batch_size": self.config.global_batch_size,
            "pass_sizes": [p.num_examples for p in self.passes],
        }


def _day_number(path: str) -> int | None:
    """The ``date.toordinal()`` of the ``day=`` folder of ``path``, or None."""
    day = day_of(path)
    return dt.date.fromisoformat(day).toordinal() if day else None


def day_ends(days: Sequence[tuple[int, int] | None]) -> dict[int, int]:
    """The log days that end after each pass of a schedule, ``{position: day}``, given each
    scheduled pass's first and last day (:meth:`PassPlan.pass_days`, over every epoch): a day
    ends after the last pass holding its rows before a pass of a later day (or the end of the
    schedule), once, and only if it is later than every day that ended before (a second epoch
    goes over old days again)."""
    out: dict[int, int] = {}
    latest = None
    for i, span in enumerate(days):
        if span is None:
            continue
        nxt = days[i + 1] if i + 1 < len(days) else None
        last = span[1]
        if (nxt is None or nxt[0] > last or nxt[1] < last) and (latest is None or last > latest):
            out[i] = latest = last
    return out


def _pass_seed(seed: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0] >> 1)


def _cut(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, stop)) for a in range(start, stop, size)]


def build_plan(
    log_: ClickLog,
    config: PassConfig,
    num_workers: int,
    seed: int = 0,
    partition_lengths: Sequence[int] | None = None,
) -> PassPlan:
    """Plan the passes of a click log for ``num_workers`` workers.

    Computes the row count of every partition (reads the input once unless ``log_`` is
    persisted or ``partition_lengths`` is given) and, with ``max_working_set``, the unique
    keys of candidate passes.
    """
    if num_workers < 1:
        raise ConfigError(f"num_workers must be >= 1, got {num_workers}")
    if partition_lengths is None:
        partition_lengths = [int(x) for x in log_.frame.map_partitions(len).compute()]
    lengths = tuple(int(x) for x in partition_lengths)
    total = sum(lengths)
    ranges = _cut(0, total, config.examples_per_pass)
    if config.max_working_set is not None:
        ranges = _fit_working_set(log_, lengths, ranges, config)
    passes = tuple(
        PassSpec(
            index=i,
            start=a,
            stop=b,
            global_batch_size=config.global_batch_size,
            num_workers=num_workers,
            seed=_pass_seed(seed, i),
            shuffled=config.shuffle_examples,
        )
        for i, (a, b) in enumerate(ranges)
    )
    files = tuple(p.path for p in log_.parts)
    if len(files) != len(lengths):
        raise ValueError(f"{len(lengths)} partition lengths for {len(files)} partitions")
    plan = PassPlan(passes, files, lengths, config, num_workers, seed)
    log.info("pass plan: %d examples in %d passes", total, len(passes))
    return plan


def _fit_working_set(
    log_: ClickLog,
    lengths: tuple[int, ...],
    ranges: list[tuple[int, int]],
    config: PassConfig,
) -> list[tuple[int, int]]:
    """Split passes whose unique keys exceed ``max_working_set`` at batch boundaries.

    Unique counts are sub-additive, so a pass with u keys is cut into ceil(u / M) pieces and
    each piece is checked again; one round of Dask computation per level of splitting.
    """
    M = config.max_working_set
    assert M is not None
    B = config.global_batch_size
    done: dict[tuple[int, int], bool] = {}
    todo = list(ranges)
    while todo:
        counts = dask.compute(*[pass_keys(log_, lengths, a, b)["key"].nunique() for a, b in todo])
        nxt = []
        for (a, b), u in zip(todo, counts, strict=True):
            if u <= M:
                done[(a, b)] = True
                continue
            nb = -(-(b - a) // B)
            if nb == 1:
                raise CapacityError(
                    f"one global batch (examples {a}..{b}) has {u} unique keys, more than "
                    f"max_working_set={M}; lower global_batch_size or raise max_working_set"
                )
            pieces = min(nb, -(-int(u) // M))
            per = -(-nb // pieces) * B
            nxt.extend(_cut(a, b, per))
        todo = nxt
    return sorted(done)


def bad_rows_by_pass(
    by_file: dict[str, dict[str, int]], plan: PassPlan
) -> dict[int, dict[str, int]]:
    """Skipped rows by reason, attributed to the pass in which each file starts (its first
    block, for a file read in blocks)."""
    lengths = np.asarray(plan.partition_lengths, dtype=np.int64)
    begins = np.cumsum(lengths) - lengths
    starts = np.array([p.start for p in plan.passes], dtype=np.int64)
    out: dict[int, dict[str, int]] = {}
    seen: set[str] = set()
    for f, b in zip(plan.files, begins, strict=True):
        if f not in by_file or not len(starts) or f in seen:
            continue
        seen.add(f)
        index = plan.passes[max(int(np.searchsorted(starts, b, side="right")) - 1, 0)].index
        for reason, n in by_file[f].items():
            out.setdefault(index, {})[reason] = out.get(index, {}).get(reason, 0) + int(n)
    return out


def warn_rereads(plan: PassPlan, block_size: int | None) -> None:
    """A partition read by many passes costs a read each, and a file that could not be cut
    into blocks (compressed, parquet, or ``data.block_size: null``) is read whole: say which,
    and what would fix it. Files within a block cost little to read again, and say nothing."""
    reads = plan.passes_per_partition()
    limit = block_size or 0
    parts_of = Counter(plan.files)  # a file read in blocks is several partitions
    many = [
        i
        for i in np.flatnonzero(reads > 2).tolist()
        if parts_of[plan.files[i]] == 1
        and os.path.exists(plan.files[i])
        and os.path.getsize(plan.files[i]) > limit
    ]
    if many:
        worst = max(many, key=lambda i: int(reads[i]))
        log.warning(
            "%d input files are each read whole by more than 2 passes (%s by %d): each pass "
            "reads a file that cannot be cut into blocks whole; split such files into parts "
            "of about a pass (passes.examples_per_pass rows), or decompress them so "
            "data.block_size can cut them",
            len(many),
            plan.files[worst],
            int(reads[worst]),
        )

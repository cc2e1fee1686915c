"""The read path of a tier stack: rows of the keys the device cache misses, and where they go.

Training (:class:`~daskhps.table.EmbeddingTable`) and serving
(:class:`~daskhps.serve.ServingLookup`) share it::

    keys the device cache missed (unique)
      │
      ▼
    host memory ──found──► promote: taken out, dirty flag kept (exclusive tiers: it moves up)
      │ missing             read:    read in place (nothing moves)
      ▼
    below ──found──► copied up, clean       training: the shard's zarr store
      │ missing                             serving:  every rank store of a version
      ▼
    init(seed, key) ──► clean: re-initialising gives the same bits
      │
      ▼ promote only
    device cache ◄── the rows (a batch larger than the cache: the rest goes down at once)
      │ displaced
      ▼
    host memory ◄── as many as it holds
      │ displaced, or no room
      ▼
    write_back(dirty rows)   training: appended to the store
                             serving: none; every row is clean, so displaced rows are dropped

What differs on purpose is a parameter: what sits ``below`` (any :class:`RowSource`), the
cached ``width`` (serving may cache only the ``dim`` embedding columns; the store and init
give whole rows), and ``write_back`` (training's dirty rows; serving writes nothing).
:attr:`ReadPath.rows_from` counts where promoted rows came from (device hits are counted by
the caller, which looks the device cache up its own way).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from daskhps.errors import ConfigError
from daskhps.table.init import init_embedding
from daskhps.table.optimizers import init_state
from daskhps.table.spec import TableSpec
from daskhps.table.stats import STATS_WIDTH
from daskhps.tiers.base import Cache, Evicted, Lookup

__all__ = ["ReadPath", "RowSource", "WriteBack", "initial_rows", "read_below"]

WriteBack = Callable[[torch.Tensor, torch.Tensor], object]


class RowSource(Protocol):
    """The bottom of a read path: whole rows (``spec.width``) of unique CPU keys, zero where
    not ``found`` (a shard's zarr store; serving's ``ShardedStores`` over every rank store)."""

    def lookup(self, keys: torch.Tensor, *, out: torch.Tensor | None = None) -> Lookup: ...


def initial_rows(spec: TableSpec, keys: torch.Tensor, *, state: bool = True) -> torch.Tensor:
    """Rows of keys never written: the embedding, then (with ``state``) the optimizer's
    initial state and zero statistics. A pure function of (table seed, key), the same in
    training, evaluation and serving (docs/invariants.md, invariant 2)."""
    emb = init_embedding(keys, seed=spec.seed, dim=spec.dim, scale=spec.scale)
    if not state:
        return emb
    opt = init_state(spec.optimizer, len(keys), spec.dim, keys.device)
    stats = torch.zeros(len(keys), STATS_WIDTH, dtype=torch.float32, device=keys.device)
    return torch.cat([emb, opt, stats], dim=1)


def read_below(
    spec: TableSpec,
    below: RowSource,
    keys: torch.Tensor,
    width: int,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """The first ``width`` columns (``spec.dim`` or ``spec.width``) of the rows of unique CPU
    ``keys`` from ``below``, initial rows for keys it lacks; and how many were initialised.
    ``out`` (whole rows only) is filled in place."""
    full = width == spec.width
    got = below.lookup(keys, out=out if full else None)
    rows = got.rows if full else got.rows[:, :width]
    fresh = (~got.found).nonzero().squeeze(1)
    if len(fresh):
        rows[fresh] = initial_rows(spec, keys[fresh], state=full)
    if out is not None and not full:
        out.copy_(rows)
        rows = out
    return rows, len(fresh)


class ReadPath:
    """Fetches rows the device cache misses from host memory, ``below`` and init, and places
    them in the caches.

    Parameters
    ----------
    spec:
        The table's spec (row layout and initial values).
    device_cache, host:
        The two caches (``host`` may be ``None``), of the same width: ``spec.dim`` or
        ``spec.width``. They are exclusive: a row sits in at most one of them.
    below:
        Where rows the caches lack are read (never written by the read path itself).
    write_back:
        ``write_back(keys, rows)`` takes dirty rows that leave host memory (or that have no
        room in it); ``None`` when every cached row is clean: displaced rows are dropped.
    """

    def __init__(
        self,
        spec: TableSpec,
        device_cache: Cache,
        host: Cache | None,
        below: RowSource,
        *,
        write_back: WriteBack | None = None,
    ) -> None:
        width = device_cache.width
        if width not in (spec.dim, spec.width) or (host is not None and host.width != width):
            raise ConfigError(
                f"table {spec.name!r}: the caches must hold rows of {spec.width} floats or the "
                f"{spec.dim} embedding columns, got device {width}"
                + ("" if host is None else f", host {host.width}")
            )
        self.spec = spec
        self.device_cache = device_cache
        self.host = host
        self.below = below
        self.write_back = write_back
        self.width = width
        self.rows_from = {"device": 0, "host": 0, "store": 0, "init": 0}

    def promote(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring unique ``keys`` missing from the device cache into it, displacing unpinned
        rows down the hierarchy. Returns ``(slots, rows)``: the device slots of the first
        ``capacity_rows`` keys (all of them when they fit, which training checks first) and
        every key's row, on the cache's device."""
        cpu_rows, dirty = self._fetch(keys)
        rows = cpu_rows.to(self.device_cache.device)
        return self._place(keys, rows, dirty, cpu_rows), rows

    def read(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows of unique ``keys`` missing from the device cache, without moving anything
        (host memory is read in place); on the cache's device."""
        n = len(keys)
        ckeys = keys.cpu()
        rows = torch.empty(n, self.width, dtype=torch.float32)
        todo = torch.ones(n, dtype=torch.bool)
        if self.host is not None and len(self.host):
            got = self.host.lookup(ckeys)
            rows[got.found] = got.rows[got.found]
            todo &= ~got.found
        rest = todo.nonzero().squeeze(1)
        if len(rest):
            self._below(ckeys, rest, rows)
        return rows.to(self.device_cache.device)

    # -- internals ---------------------------------------------------------------------------

    def _fetch(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """CPU rows of device-missing unique keys from host (moved), below (copied) or init,
        with their dirty flags relative to the store; counted in :attr:`rows_from`."""
        n = len(keys)
        rows = torch.empty(n, self.width, dtype=torch.float32)
        dirty = torch.zeros(n, dtype=torch.bool)
        ckeys = keys.cpu()
        todo = torch.ones(n, dtype=torch.bool)
        if self.host is not None and len(self.host):
            found, taken = self.host.take(ckeys)
            if len(taken):
                rows[found] = taken.rows
                dirty[found] = taken.dirty
                todo &= ~found
                self.rows_from["host"] += len(taken)
        rest = todo.nonzero().squeeze(1)
        if len(rest):
            fresh = self._below(ckeys, rest, rows)
            self.rows_from["store"] += len(rest) - fresh
            self.rows_from["init"] += fresh
        return rows, dirty

    def _below(self, ckeys: torch.Tensor, rest: torch.Tensor, rows: torch.Tensor) -> int:
        """``rows[rest]`` from below or init; returns how many were initialised."""
        spec, width = self.spec, self.width
        if len(rest) == len(ckeys):  # nothing came from host memory: fill the block in place
            return read_below(spec, self.below, ckeys, width, out=rows)[1]
        got, fresh = read_below(spec, self.below, ckeys[rest], width)
        rows[rest] = got
        return fresh

    def _place(
        self, keys: torch.Tensor, rows: torch.Tensor, dirty: torch.Tensor, cpu_rows: torch.Tensor
    ) -> torch.Tensor:
        """Insert fetched rows into the device cache (the first ``capacity_rows`` of them);
        what that displaces, then the rest, go down. Returns the device slots."""
        cache = self.device_cache
        cap = cache.capacity_rows
        over = None
        if len(keys) > cap:  # serving only (training refuses batches that do not fit)
            over = Evicted(keys[cap:].cpu(), cpu_rows[cap:], dirty[cap:])
            keys, rows, dirty = keys[:cap], rows[:cap], dirty[:cap]
        slots, displaced = cache.insert_new(keys, rows, dirty)
        if over is not None:
            displaced = Evicted.concat([displaced.to("cpu"), over], self.width)
        self._push_down(displaced)
        return slots

    def _push_down(self, displaced: Evicted) -> None:
        """Rows displaced from the device go to host memory; dirty rows that host memory
        cannot keep go to ``write_back`` (clean ones are dropped: below or init gives them
        back)."""
        if not len(displaced):
            return
        displaced = displaced.to("cpu")
        write = self.write_back
        to_store = []
        if self.host is None:
            if write is not None:
                to_store.append(displaced.only_dirty())
        else:
            cap = self.host.capacity_rows
            if len(displaced) > cap:  # more than host memory holds: the rest goes straight down
                if write is not None:
                    rest = Evicted(
                        displaced.keys[cap:], displaced.rows[cap:], displaced.dirty[cap:]
                    )
                    to_store.append(rest.only_dirty())
                displaced = Evicted(
                    displaced.keys[:cap], displaced.rows[:cap], displaced.dirty[:cap]
                )
            if len(displaced):
                # Tiers are exclusive: rows leaving the device are unique and not in host memory.
                _, pushed = self.host.insert_new(displaced.keys, displaced.rows, displaced.dirty)
                if write is not None:
                    to_store.append(pushed.only_dirty())
        if write is not None:
            down = Evicted.concat(to_store, self.width)
            if len(down):
                write(down.keys, down.rows)

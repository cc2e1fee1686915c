"""Tier budgets of one worker, declared once: rows or fractions of its memory to rows and bytes,
and the memory budget the tiers in its process must stay under, at one price per row.

Everything that sizes the tiers goes through :class:`TierSizing`: the config check
(``daskhps.config.runconfig``), ``daskhps plan`` (``daskhps.capacity.fit``), ``train`` (the
trainer hands it to :class:`~daskhps.distributed.WorkerShards`) and the workers (which resolve
it against their memory limit). The config's ``table.tiers`` keys become one through
``TiersConfig.sizing``.

On a machine without GPU the device tier and the host tier both live in the worker process,
so their shares add up against the Dask worker's memory limit, which pauses the worker at
:data:`PAUSE_FRACTION` and kills it at 95%: :data:`MEMORY_BUDGET` keeps the tiers well below
the pause line, leaving room for batches, the dense model and Dask's own data. On a GPU the
device fraction is of the GPU's memory instead. A row is priced as the tiers allocate it: its
floats, metadata and share of the key index (:func:`~daskhps.tiers.host.rows_for_bytes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from daskhps.errors import ConfigError
from daskhps.table.spec import TableSpec
from daskhps.tiers.host import rows_for_bytes

__all__ = [
    "KEYED_SHARE",
    "MEMORY_BUDGET",
    "PAUSE_FRACTION",
    "OwnBudget",
    "TierSizing",
    "row_cost",
    "shares",
]

# Dask pauses a worker at 80% of its memory limit. Without a GPU the device and host tiers
# share the worker's process memory, so together they may take at most MEMORY_BUDGET of it:
# the rest is room for the dense model, batches, staging buffers and Dask itself.
PAUSE_FRACTION = 0.8
MEMORY_BUDGET = 0.6


@dataclass(frozen=True)
class OwnBudget:
    """A table's own tier budgets (a ``tables`` entry's ``tiers``): each one given is the
    table's alone; each one left None it shares with the other tables (the run's budget)."""

    device_fraction: float | None = None
    device_rows: int | None = None
    host_fraction: float | None = None
    policy: str | None = None


@dataclass(frozen=True)
class TierSizing:
    """Budgets of the device and host tiers of one worker, shared by all its tables.

    Give the device tier either ``device_fraction`` or ``device_rows`` (rows per table), and
    the host tier ``host_fraction``, ``host_bytes`` (per table) or neither (no host tier).
    A fractional budget shared by several tables is split between them by :func:`shares`:
    in proportion to each table's keys in a pass when they are known (the workers count the
    first pass they stage, ``daskhps plan`` its largest), else into the same number of rows
    for every table. The fractions' range is the config's to check (``table.tiers``); their
    sum is checked here, against :data:`MEMORY_BUDGET`.
    """

    device_fraction: float | None = None
    host_fraction: float | None = None
    device_rows: int | None = None
    host_bytes: int | None = None
    # (table, its own budgets): those tables take their own budgets, the others share these
    own: tuple[tuple[str, OwnBudget], ...] = ()

    def __post_init__(self) -> None:
        if (self.device_fraction is None) == (self.device_rows is None):
            raise ConfigError(
                "tier sizing: give exactly one of device_fraction and device_rows, got "
                f"device_fraction={self.device_fraction!r}, device_rows={self.device_rows!r}"
            )
        if self.host_fraction is not None and self.host_bytes is not None:
            raise ConfigError("tier sizing: give host_fraction or host_bytes, not both")
        if self.device_rows is not None and self.device_rows < 1:
            raise ConfigError(f"tier sizing: device_rows must be >= 1, got {self.device_rows}")
        if self.host_bytes is not None and self.host_bytes < 0:
            raise ConfigError(f"tier sizing: host_bytes must be >= 0, got {self.host_bytes}")

    def over_budget(
        self,
        tables: Sequence[TableSpec],
        memory_limit: int | None,
        *,
        on_gpu: bool,
        policy: str = "lru",
    ) -> str | None:
        """Why the tiers in the worker's process memory would take more than
        :data:`MEMORY_BUDGET` of ``memory_limit``, or None. Rows and bytes count only when
        the limit is known (each row at :func:`row_cost`); on a GPU the device tier is not in
        the process. Tables with budgets of their own (:attr:`own`) add them."""
        used, parts = 0.0, []
        own = dict(self.own)
        for t in tables:
            b = own.get(t.name)
            if b is None:
                continue
            if not on_gpu and b.device_fraction is not None:
                used += b.device_fraction
                parts.append(f"{t.name}'s device.fraction {b.device_fraction}")
            elif not on_gpu and b.device_rows is not None and memory_limit:
                frac = b.device_rows * row_cost(t.width, b.policy or policy) / memory_limit
                used += frac
                parts.append(f"{t.name}'s device.rows {b.device_rows} ({frac:.2f})")
            if b.host_fraction is not None:
                used += b.host_fraction
                parts.append(f"{t.name}'s host.fraction {b.host_fraction}")
        shared_device, shared_host = self._sharing(tables, "device"), self._sharing(tables, "host")
        if not shared_device and not shared_host:
            return self._verdict(used, parts, on_gpu)
        if not shared_device:  # the run's device budget is nobody's
            return self._over(shared_host, memory_limit, on_gpu, policy, used, parts, device=False)
        return self._over(
            shared_device, memory_limit, on_gpu, policy, used, parts, host=bool(shared_host)
        )

    def splits(self, tables: Sequence[TableSpec]) -> bool:
        """Whether several of ``tables`` share a fractional budget (split by :func:`shares`)."""
        return (len(self._sharing(tables, "device")) > 1 and self.device_fraction is not None) or (
            len(self._sharing(tables, "host")) > 1 and self.host_fraction is not None
        )

    def _sharing(self, tables: Sequence[TableSpec], tier: str) -> list[TableSpec]:
        """The tables of ``tables`` without a budget of their own for ``tier``: they share
        the run's."""
        return [t for t in tables if self._own(t.name, tier) is None]

    def _own(self, table: str, tier: str) -> OwnBudget | None:
        """The table's own budget of ``tier`` ("device" or "host"), if it has one."""
        b = dict(self.own).get(table)
        if b is None:
            return None
        given = b.host_fraction if tier == "host" else (b.device_fraction or b.device_rows)
        return b if given is not None else None

    def _over(
        self,
        tables: Sequence[TableSpec],
        memory_limit: int | None,
        on_gpu: bool,
        policy: str,
        used: float,
        parts: list[str],
        *,
        device: bool = True,
        host: bool = True,
    ) -> str | None:
        if not device:
            pass
        elif not on_gpu and self.device_fraction is not None:
            used += self.device_fraction
            parts.append(f"device.fraction {self.device_fraction}")
        elif not on_gpu and self.device_rows is not None and memory_limit:
            frac = sum(self.device_rows * row_cost(t.width, policy) for t in tables) / memory_limit
            used += frac
            parts.append(f"device.rows {self.device_rows} ({frac:.2f} of memory_limit)")
        if not host:
            pass
        elif self.host_bytes is None:
            used += self.host_fraction or 0.0
            parts.append(f"host.fraction {self.host_fraction or 0.0}")
        elif memory_limit:
            frac = self.host_bytes * len(tables) / memory_limit
            used += frac
            parts.append(f"host_bytes {self.host_bytes} ({frac:.2f} of memory_limit)")
        return self._verdict(used, parts, on_gpu)

    @staticmethod
    def _verdict(used: float, parts: list[str], on_gpu: bool) -> str | None:
        if used <= MEMORY_BUDGET + 1e-12:
            return None
        pause = f"Dask pauses a worker at {PAUSE_FRACTION:.0%} of its limit"
        if on_gpu:
            return (
                f"{' + '.join(parts)} = {used:.2f} of the worker memory limit; {pause}, so keep "
                f"it <= {MEMORY_BUDGET} (room for the model and batches)"
            )
        return (
            f"{' + '.join(parts)} = {used:.2f} of the worker memory limit; without a GPU the "
            f"device and host tiers share the worker's process memory and {pause}, so keep the "
            f"sum <= {MEMORY_BUDGET} (room for the model and batches), or set cluster.gpu: true "
            "for GPU workers"
        )

    def resolve(
        self,
        tables: Sequence[TableSpec],
        memory_limit: int | None,
        device: str = "cpu",
        policy: str = "lru",
        *,
        check_budget: bool = True,
        keys: Mapping[str, int] | None = None,
    ) -> dict[str, tuple[int, int]]:
        """``{table: (device_rows, host_bytes)}`` for a worker with this memory limit;
        tiers over the memory budget are refused unless ``check_budget`` is off (``daskhps
        plan`` sizes them anyway, to say by how much the whole run does not fit). ``keys``:
        each table's keys in a pass, by which a shared fractional budget is split
        (:func:`shares`); None: the same rows for every table."""
        on_gpu = torch.device(device).type == "cuda"
        problem = self.over_budget(tables, memory_limit, on_gpu=on_gpu, policy=policy)
        if problem and check_budget:
            raise ConfigError(f"tier sizing: {problem}")
        owns = [b for _, b in self.own]
        needs_limit = (
            self.host_fraction is not None
            or (self.device_fraction is not None and not on_gpu)
            or any(b.host_fraction is not None for b in owns)
            or (not on_gpu and any(b.device_fraction is not None for b in owns))
        )
        if needs_limit and not memory_limit:
            raise ConfigError(
                "tier sizing: fractions need a worker memory limit, but the worker has none: "
                "set the cluster's memory_limit or give device_rows/host_bytes"
            )
        pool = (
            torch.cuda.get_device_properties(torch.device(device)).total_memory
            if on_gpu
            else memory_limit or 0
        )
        device_split, host_split = (
            shares({t.name: row_cost(t.width, policy) for t in self._sharing(tables, tier)}, keys)
            for tier in ("device", "host")
        )

        def share(budget: float, split: dict[str, float], name: str) -> int:
            return int(budget * split[name])

        out = {}
        for t in tables:
            own = dict(self.own).get(t.name, OwnBudget())
            if own.device_rows is not None:
                rows = own.device_rows
            elif own.device_fraction is not None:
                frac = own.device_fraction
                rows = rows_for_bytes(t.width, int(frac * pool), own.policy or policy)
            elif self.device_rows is not None:
                rows = self.device_rows
            else:
                frac = self.device_fraction or 0.0
                rows = rows_for_bytes(t.width, share(frac * pool, device_split, t.name), policy)
            if rows < 1:
                raise ConfigError(
                    f"tier sizing: table {t.name!r} gets no device rows from "
                    f"device fraction {frac}: raise it or the memory limit"
                )
            if own.host_fraction is not None:
                host = int(own.host_fraction * (memory_limit or 0))
            elif self.host_bytes is not None:
                host = self.host_bytes
            elif self.host_fraction is not None:
                host = share(self.host_fraction * (memory_limit or 0), host_split, t.name)
            else:
                host = 0
            out[t.name] = (rows, host)
        return out


# Of a budget split by keys, the part split by them; the rest gives every table the same
# rows, so that a table with few keys in the pass that sized the split still has rows for
# passes that bring it more.
KEYED_SHARE = 0.9


def shares(costs: Mapping[str, float], keys: Mapping[str, int] | None) -> dict[str, float]:
    """Each table's fraction of a budget the tables in ``costs`` (a row's bytes in each) share.

    Without ``keys`` every table gets the same number of rows. With ``keys`` (each table's
    keys in a pass), :data:`KEYED_SHARE` of the rows go to the tables in proportion to their
    keys, the rest in equal rows: every table then has the same room over its keys, the
    budget the tables' keys can fill best. The fractions add up to 1.
    """
    if not costs:
        return {}
    n = len(costs)
    counts = {name: max(int(keys.get(name, 0)), 0) for name in costs} if keys is not None else {}
    total = sum(counts.values())
    if total == 0:
        rows = dict.fromkeys(costs, 1.0 / n)
    else:
        rows = {name: KEYED_SHARE * counts[name] / total + (1 - KEYED_SHARE) / n for name in costs}
    weights = {name: rows[name] * costs[name] for name in costs}
    whole = sum(weights.values()) or 1.0
    return {name: w / whole for name, w in weights.items()}


def row_cost(width: int, policy: str) -> float:
    """Bytes a resident row costs in a tier, all overheads included (measured on 16 MiB)."""
    budget = 1 << 24
    return budget / max(rows_for_bytes(width, budget, policy), 1)

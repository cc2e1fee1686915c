"""The ``table`` section: embedding dim, sparse optimizer, initialisation and the tiers.

::

    table.tiers:   device (rows, or a fraction of the worker memory limit)
                   -> host (a fraction of the worker memory limit; 0 disables it)
                   -> zarr store under store_dir (local disk)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from daskhps.config._context import Ctx
from daskhps.table.optimizers import OptimizerSpec

__all__ = ["DeviceTierConfig", "HostTierConfig", "TableConfig", "TiersConfig"]

POLICIES = ("lru", "lfu")
OPTIMIZER_KINDS = ("sgd", "adagrad", "adam")


@dataclass(frozen=True)
class DeviceTierConfig:
    """Device cache size per worker: ``rows``, or a ``fraction`` of the worker's memory limit
    (of its GPU memory on a GPU worker). A pass's share of keys must fit."""

    rows: int | None = None
    fraction: float | None = 0.25

    KEYS: ClassVar[tuple[str, ...]] = ("rows", "fraction")

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> DeviceTierConfig:
        p = "table.tiers.device"
        d = ctx.mapping(d, cls.KEYS, p)
        rows = ctx.get(d, p, "rows", (int, type(None)), None, minimum=1)
        fraction = ctx.get(d, p, "fraction", (float, type(None)), None, minimum=0.0, below=1.0)
        if rows is not None and fraction is not None:
            raise ctx.error(p, "give rows or fraction, not both")
        if rows is None and fraction is None:
            fraction = cls.fraction
        if fraction is not None and fraction <= 0:
            raise ctx.error(f"{p}.fraction", f"must be > 0, got {fraction!r}")
        return cls(rows=rows, fraction=fraction)

    def capacity_rows(self, memory_limit: int, bytes_per_row: int) -> int:
        """Rows of the device cache on a worker with ``memory_limit`` bytes."""
        if self.rows is not None:
            return self.rows
        assert self.fraction is not None
        return max(1, int(self.fraction * memory_limit) // bytes_per_row)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "fraction": self.fraction}


@dataclass(frozen=True)
class HostTierConfig:
    """Host-memory tier per worker: a ``fraction`` of the worker's memory limit (0: none)."""

    fraction: float = 0.35

    KEYS: ClassVar[tuple[str, ...]] = ("fraction",)

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> HostTierConfig:
        p = "table.tiers.host"
        d = ctx.mapping(d, cls.KEYS, p)
        return cls(fraction=ctx.get(d, p, "fraction", float, 0.35, minimum=0.0, below=1.0))

    def capacity_bytes(self, memory_limit: int) -> int:
        return int(self.fraction * memory_limit)

    def to_dict(self) -> dict[str, Any]:
        return {"fraction": self.fraction}


@dataclass(frozen=True)
class TiersConfig:
    """Sizes and policy of the tier stack of every (table, worker) shard."""

    device: DeviceTierConfig = field(default_factory=DeviceTierConfig)
    host: HostTierConfig = field(default_factory=HostTierConfig)
    policy: str = "lru"
    store_dir: str = "runs/daskhps/stores"
    snapshot_every: int = 8

    KEYS: ClassVar[tuple[str, ...]] = ("device", "host", "policy", "store_dir", "snapshot_every")

    @classmethod
    def parse(cls, d: Any, ctx: Ctx, run_dir: str) -> TiersConfig:
        p = "table.tiers"
        d = ctx.mapping(d, cls.KEYS, p)
        return cls(
            device=DeviceTierConfig.parse(d.get("device"), ctx)
            if d.get("device") is not None
            else DeviceTierConfig(),
            host=HostTierConfig.parse(d.get("host"), ctx),
            policy=ctx.get(d, p, "policy", str, "lru", choices=POLICIES),
            store_dir=ctx.get(d, p, "store_dir", (str, type(None)), None) or f"{run_dir}/stores",
            snapshot_every=ctx.get(d, p, "snapshot_every", int, 8, minimum=1),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device.to_dict(),
            "host": self.host.to_dict(),
            "policy": self.policy,
            "store_dir": self.store_dir,
            "snapshot_every": self.snapshot_every,
        }


def _optimizer(d: Any, ctx: Ctx) -> OptimizerSpec:
    p = "table.optimizer"
    names = tuple(f.name for f in fields(OptimizerSpec))
    d = ctx.mapping(d, names, p)
    base = OptimizerSpec()
    kw: dict[str, Any] = {"kind": ctx.get(d, p, "kind", str, base.kind, choices=OPTIMIZER_KINDS)}
    kw["lr"] = ctx.get(d, p, "lr", float, base.lr)
    if not kw["lr"] > 0:
        raise ctx.error(f"{p}.lr", f"must be > 0, got {kw['lr']!r}")
    kw["row_wise"] = ctx.get(d, p, "row_wise", bool, base.row_wise)
    for name in ("eps", "initial_accumulator", "beta1", "beta2"):
        kw[name] = ctx.get(d, p, name, float, getattr(base, name), minimum=0.0)
    with ctx.section(p):  # the remaining checks (row_wise needs adagrad, betas < 1) live there
        return OptimizerSpec(**kw)


@dataclass(frozen=True)
class TableConfig:
    """The embedding table: ``dim`` is the embedding width the model sees; the row width is
    the model's ``sparse_dim(dim)`` (one more column for DeepFM and Wide&Deep) plus optimizer
    state. A row starts as a pure function of (``seed``, key). ``expected_keys`` (distinct
    keys of the table) only sizes the run: ``daskhps plan`` and the trainer's early check."""

    name: str = "embeddings"
    dim: int = 16
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    seed: int = 0
    init_scale: float | None = None
    tiers: TiersConfig = field(default_factory=TiersConfig)
    expected_keys: int | None = None

    KEYS: ClassVar[tuple[str, ...]] = (
        "name",
        "dim",
        "optimizer",
        "seed",
        "init_scale",
        "tiers",
        "expected_keys",
    )

    @classmethod
    def parse(cls, d: Any, ctx: Ctx, run_dir: str, seed: int) -> TableConfig:
        p = "table"
        d = ctx.mapping(d, cls.KEYS, p)
        name = ctx.get(d, p, "name", str, "embeddings")
        if not name or not all(c.isalnum() or c in "-_." for c in name):
            raise ctx.error(f"{p}.name", f"{name!r}: use letters, digits, '-', '_' or '.'")
        seed_ = ctx.get(d, p, "seed", (int, type(None)), None, minimum=0)
        return cls(
            name=name,
            dim=ctx.get(d, p, "dim", int, 16, minimum=1),
            optimizer=_optimizer(d.get("optimizer"), ctx),
            seed=seed if seed_ is None else seed_,
            init_scale=ctx.get(d, p, "init_scale", (float, type(None)), None, minimum=0.0),
            tiers=TiersConfig.parse(d.get("tiers"), ctx, run_dir),
            expected_keys=ctx.get(d, p, "expected_keys", (int, type(None)), None, minimum=1),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dim": self.dim,
            "optimizer": self.optimizer.as_dict(),
            "seed": self.seed,
            "init_scale": self.init_scale,
            "tiers": self.tiers.to_dict(),
            "expected_keys": self.expected_keys,
        }

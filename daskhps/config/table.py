"""The ``table`` section: embedding dim, sparse optimizer, initialisation and the tiers.

::

    table.tiers:   device (rows, or a fraction of the worker memory limit)
                   -> host (a fraction of the worker memory limit; 0 disables it)
                   -> zarr store under store_dir (local disk)
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo

from daskhps.options import Ctx, Int, Options, Problem, shown, validate
from daskhps.table.admission import AdmissionRule
from daskhps.table.expiry import ExpiryRule
from daskhps.table.optimizers import OptimizerSpec
from daskhps.tier_sizing import TierSizing
from daskhps.tiers.store.options import StoreOptions

__all__ = [
    "AdmissionConfig",
    "DeviceTierConfig",
    "ExpiryConfig",
    "HostTierConfig",
    "TableConfig",
    "TiersConfig",
    "store_name",
]


def _as_in(options: type[Options], name: str) -> Any:  # a FieldInfo, typed as its value
    """A config key that is one of a component's options, declared there: its type's
    coercion, default, bounds and doc line."""
    return FieldInfo.merge_field_infos(options.model_fields[name])


class DeviceTierConfig(Options):
    """Device cache size per worker: ``rows``, or a ``fraction`` of the worker's memory limit
    (of its GPU memory on a GPU worker). A pass's share of keys must fit."""

    rows: Int | None = Field(None, ge=1)
    """Rows of the device cache."""
    fraction: float | None = Field(0.25, gt=0.0, lt=1.0)
    """Of the worker memory limit (GPU memory on GPU workers)."""

    @model_validator(mode="before")
    @classmethod
    def _rows_or_fraction(cls, data: Any) -> Any:
        # Rows given: no fraction unless one is written too (then it is refused below).
        if isinstance(data, dict) and data.get("rows") is not None and "fraction" not in data:
            return {**data, "fraction": None}
        return data

    @model_validator(mode="after")
    def _one_size(self) -> DeviceTierConfig:
        if self.rows is not None and self.fraction is not None:
            raise Problem("", "give rows or fraction, not both")
        if self.rows is None and self.fraction is None:
            return self.replace(fraction=type(self).model_fields["fraction"].default)
        return self


class HostTierConfig(Options):
    """Host-memory tier per worker: a ``fraction`` of the worker's memory limit (0: none)."""

    fraction: float = Field(0.35, ge=0.0, lt=1.0)
    """Of the worker memory limit; 0: none."""


class TiersConfig(Options):
    """Sizes and policy of the tier stack of every (table, worker) shard."""

    device: DeviceTierConfig = DeviceTierConfig()
    """Device cache per worker: `rows` or `fraction`."""
    host: HostTierConfig = HostTierConfig()
    """Host-memory tier per worker."""
    policy: Literal["lru", "lfu"] = "lru"
    """Eviction policy of device and host tiers."""
    store_dir: str = Field(
        "runs/daskhps/stores",
        validate_default=True,
        json_schema_extra=shown("path", "`<run.dir>/stores`"),
    )
    """Zarr stores (local disk)."""
    snapshot_every: int = _as_in(StoreOptions, "snapshot_every")

    NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = ("device", "host")

    @property
    def sizing(self) -> TierSizing:
        """The tier budgets of every worker (rows and bytes, and the memory budget, are
        :class:`~daskhps.tier_sizing.TierSizing`'s): host fraction 0 means no host tier."""
        return TierSizing(
            device_fraction=self.device.fraction,
            device_rows=self.device.rows,
            host_fraction=self.host.fraction or None,
        )

    @property
    def store(self) -> StoreOptions:
        """How every shard's zarr store writes (the rest of its options keep their defaults)."""
        return StoreOptions(snapshot_every=self.snapshot_every)

    @model_validator(mode="before")
    @classmethod
    def _stores_in_the_run(cls, data: Any, info: ValidationInfo) -> Any:
        # The stores default to (and null means) <run.dir>/stores.
        context = info.context or {}
        if isinstance(data, dict) and data.get("store_dir") is None and "run_dir" in context:
            return {**data, "store_dir": f"{context['run_dir']}/stores"}
        return data


class AdmissionConfig(Options):
    """When a key gets a row: once it occurred ``min_count`` times (then with ``probability``
    per occurrence). A key not admitted yet reads its initial value and takes no update; its
    count waits in the shard's pending counts (16 bytes a key), committed with checkpoints."""

    min_count: Int = Field(1, ge=1)
    """Occurrences a key needs for a row; 1: every key, at once."""
    probability: float = Field(1.0, gt=0.0, le=1.0)
    """Chance each occurrence from the `min_count`-th on admits it."""

    def rule(self, seed: int) -> AdmissionRule:
        return AdmissionRule(self.min_count, self.probability, seed)


class ExpiryConfig(Options):
    """When rows leave the table, at each day boundary (the end of the last pass holding a
    day's rows, and the end of the run): rows not seen for ``ttl_days`` log days, and rows
    beyond ``max_rows`` by ``score``. An expired key reads its initial value again."""

    ttl_days: Int | None = Field(None, ge=1)
    """Log days a row stays unseen before it expires; null: never."""
    max_rows: Int | None = Field(None, ge=1)
    """Rows the table keeps (each virtual shard its share); null: any."""
    score: Literal["lfu", "lru"] = "lfu"
    """Which rows `max_rows` keeps: most occurrences, or most recent day."""

    def rule(self, num_shards: int) -> ExpiryRule:
        return ExpiryRule(self.ttl_days, self.max_rows, self.score, num_shards)


def store_name(name: str) -> str:
    """``name`` when it can name a table's stores (letters, digits, '-', '_', '.')."""
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise Problem("", f"{name!r}: use letters, digits, '-', '_' or '.'")
    return name


class TableConfig(Options):
    """The embedding table: ``dim`` is the embedding width the model sees; the row width is
    the model's ``sparse_dim(dim)`` (one more column for DeepFM and Wide&Deep) plus optimizer
    state. A row starts as a pure function of (``seed``, key). ``expected_keys`` (distinct
    keys of the table) only sizes the run: ``daskhps plan`` and the trainer's early check."""

    name: str = "embeddings"
    """Table name (store paths, messages)."""
    dim: Int = Field(16, ge=1)
    """Embedding dim; the model may add columns (`sparse_dim`)."""
    optimizer: OptimizerSpec = OptimizerSpec()
    """Sparse optimizer; its state lives in the row."""
    seed: Int = Field(0, ge=0, json_schema_extra=shown(default="`run.seed`"))
    """Initialisation seed: a row starts as f(seed, key)."""
    init_scale: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    """Uniform init bound; null: `1/sqrt(dim)`."""
    tiers: TiersConfig = TiersConfig()
    """The tier stack of every worker's shard."""
    expected_keys: Int | None = Field(None, ge=1)
    """Distinct keys expected; sizes the run (`daskhps plan`, `train`'s early check)."""
    admission: AdmissionConfig = AdmissionConfig()
    """When a key gets a row (`min_count`, `probability`)."""
    expiry: ExpiryConfig = ExpiryConfig()
    """When rows leave the table (`ttl_days`, `max_rows`, `score`)."""

    NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = ("admission", "expiry")

    @property
    def admission_rule(self) -> AdmissionRule:
        """The admission rule of this table (seeded with the table's seed)."""
        return self.admission.rule(self.seed)

    @model_validator(mode="before")
    @classmethod
    def _seed_of_the_run(cls, data: Any, info: ValidationInfo) -> Any:
        # The seed defaults to (and null means) run.seed; the tiers' defaults need run.dir.
        if data is None:
            data = {}
        if isinstance(data, dict) and info.context and "seed" in info.context:
            if data.get("seed") is None:
                data = {**data, "seed": info.context["seed"]}
            if data.get("tiers") is None:
                data = {**data, "tiers": {}}
        return data

    @field_validator("name")
    @classmethod
    def _store_name(cls, name: str) -> str:
        return store_name(name)

    @classmethod
    def parse(cls, d: Any, ctx: Ctx, run_dir: str, seed: int) -> TableConfig:
        return validate(cls, d, ctx, "table", {"run_dir": run_dir, "seed": seed})

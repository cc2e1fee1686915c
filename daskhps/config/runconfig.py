"""The whole run configuration: a frozen tree of sections, loaded from YAML and checked
across sections (memory fractions, tier sizes against the plan, backend against devices)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from torch import nn

from daskhps._yaml import dump_yaml, load_yaml_with_lines
from daskhps.config._keys import SECTIONS
from daskhps.config.checkpoint import CheckpointConfig
from daskhps.config.cluster import ClusterConfig
from daskhps.config.data import DataConfig
from daskhps.config.overrides import apply_overrides
from daskhps.config.retrain import RetrainConfig
from daskhps.config.run import RunSection
from daskhps.config.storage import StorageConfig
from daskhps.config.table import TableConfig
from daskhps.config.tables import TableEntry, default_table, parse_tables, taken_from_table
from daskhps.config.training import DenseOptimizerConfig, EvalConfig, PassesConfig
from daskhps.data.keyspace import FieldKeys
from daskhps.errors import ConfigError
from daskhps.models.base import InputLayout, UnequalWidthsError, list_widths
from daskhps.models.spec import ModelSpec
from daskhps.options import Ctx, values_written
from daskhps.storage import use_options
from daskhps.table.spec import TableSpec
from daskhps.tier_sizing import MEMORY_BUDGET, TierSizing  # daskhps.config.MEMORY_BUDGET

__all__ = ["MEMORY_BUDGET", "RunConfig", "load_config"]


@dataclass(frozen=True)
class RunConfig:
    """A validated run: every section frozen, every default filled in.

    ``source`` names where it came from (a file, ``<dict>``); it is not part of equality.
    :meth:`to_dict` gives a plain mapping that :meth:`from_dict` reads back to an equal
    config (without ``storage``, which holds how stores are reached, credentials maybe, and
    is no part of a run's identity); the object pickles, so it can be sent to Dask workers.
    """

    run: RunSection = field(default_factory=lambda: RunSection())
    data: DataConfig = field(default_factory=DataConfig)
    passes: PassesConfig = field(default_factory=lambda: PassesConfig())
    table: TableConfig = field(default_factory=lambda: TableConfig())
    tables: tuple[TableEntry, ...] = ()
    model: ModelSpec = field(default_factory=lambda: ModelSpec("dlrm"))
    dense_optimizer: DenseOptimizerConfig = field(default_factory=lambda: DenseOptimizerConfig())
    cluster: ClusterConfig = field(default_factory=lambda: ClusterConfig())
    eval: EvalConfig = field(default_factory=lambda: EvalConfig())
    checkpoint: CheckpointConfig = field(default_factory=lambda: CheckpointConfig())
    retrain: RetrainConfig = field(default_factory=lambda: RetrainConfig())
    # How stores are reached, not what the run is: a run read with other credentials is the
    # same run, and to_dict (config.yaml) leaves it out so no credential reaches the folder.
    storage: StorageConfig = field(default_factory=lambda: StorageConfig(), compare=False)
    source: str = field(default="<dict>", compare=False)
    # Where each value was written (the file's lines, the --set keys): a message about a value
    # of a loaded run, a resume's refused change, names its line. Not part of the run either.
    origins: Ctx = field(default_factory=Ctx, compare=False, repr=False)

    def __post_init__(self) -> None:
        # The schema hashes each field into its table's keys (daskhps.data.keyspace): every
        # reader of the logs gets it with the schema, on the driver and on the workers.
        keys = self.field_keys()
        if keys != self.data.schema.field_keys:
            schema = self.data.schema.keyed(keys)
            object.__setattr__(self, "data", self.data.model_copy(update={"schema": schema}))

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any], source: str = "<dict>", overrides: Iterable[str] = ()
    ) -> RunConfig:
        """Validate a mapping (as read from YAML); ``overrides`` are ``key=value`` strings."""
        d, overridden = apply_overrides(d, overrides, source)
        return _parse(d, Ctx(source, {}, overridden), "daskhps")

    def to_dict(self) -> dict[str, Any]:
        """Plain values (str, int, float, bool, None, lists, dicts) in section order."""
        return {
            "run": self.run.to_dict(),
            "data": self.data.to_dict(),
            "passes": self.passes.to_dict(),
            "table": self.table.to_dict(),
            # A run of one table writes no tables: its config.yaml is what it always was.
            **({"tables": [t.to_dict() for t in self.tables]} if self.tables else {}),
            "model": self.model.to_dict(),
            "dense_optimizer": self.dense_optimizer.to_dict(),
            "cluster": self.cluster.to_dict(),
            "eval": self.eval.to_dict(),
            "checkpoint": self.checkpoint.to_dict(),
            "retrain": self.retrain.to_dict(),
        }

    def to_yaml(self) -> str:
        return dump_yaml(self.to_dict())

    @property
    def sparse_dim(self) -> int:
        """Floats per key the model reads from the run's one table: its ``dim`` (``table.dim``
        without ``tables``) plus the model's extra columns."""
        return self.table_spec().dim

    def table_spec(self) -> TableSpec:
        """The :class:`TableSpec` of the run's one table (row width from the model).

        Raises
        ------
        ConfigError
            When the config has several tables (:attr:`several_tables`).
        """
        if self.several_tables:
            names = ", ".join(t.name for t in self.embedding_tables())
            raise ConfigError(f"this needs one table; the config has tables {names}")
        return self.table_specs()[0]

    def embedding_tables(self) -> tuple[TableEntry, ...]:
        """Every embedding table: the ``tables`` entries as written, then the default table
        (``table``'s settings, named ``table.name``) with every categorical field no entry
        lists, in schema order, if any is left. Without ``tables``: one table of every field."""
        return self._embedding_tables

    @cached_property
    def _embedding_tables(self) -> tuple[TableEntry, ...]:
        # Built once: the default table is validated like any entry. A frozen dataclass takes
        # a cached_property (it writes the instance's __dict__, not through __setattr__).
        listed = {f for t in self.tables for f in t.features}
        rest = [f for f in self.data.schema.categorical_names if f not in listed]
        return self.tables + ((default_table(self.table, rest),) if rest else ())

    def field_tables(self) -> tuple[int, ...]:
        """Per categorical field (schema order): the index of its table in
        :meth:`embedding_tables`."""
        at = {f: i for i, t in enumerate(self.embedding_tables()) for f in t.features}
        return tuple(at[f] for f in self.data.schema.categorical_names)

    def field_dims(self) -> tuple[int, ...]:
        """Per categorical field (schema order): its table's embedding dim."""
        tables = self.embedding_tables()
        return tuple(tables[i].dim for i in self.field_tables())

    def table_specs(self) -> tuple[TableSpec, ...]:
        """A :class:`TableSpec` per :meth:`embedding_tables` entry (row width from the model)."""
        return tuple(t.spec(self.model) for t in self.embedding_tables())

    def input_layout(self) -> InputLayout:
        """What the run's model reads: the schema's dense features and categorical fields,
        each as wide as its table (``embedding_dim`` the widest)."""
        return InputLayout.of_fields(len(self.data.schema.dense_names), self.field_dims())

    def build_model(self) -> nn.Module:
        """The run's dense model for :meth:`input_layout`, as every rank builds it (from
        torch's global generator: seed it first)."""
        return self.model.build_for(self.input_layout())

    def tier_sizing(self) -> TierSizing:
        """Every worker's tier budgets: ``table.tiers``, shared by the tables, and the budgets
        of the tables that have their own (``tables[].tiers``)."""
        own = tuple((t.name, t.tiers.budget()) for t in self.tables if t.tiers is not None)
        return replace(self.table.tiers.sizing, own=own)

    def sparse_widths(self) -> tuple[int, ...]:
        """Per categorical field: the floats of its row the model reads."""
        return tuple(self.model.sparse_dim(d) for d in self.field_dims())

    def field_keys(self) -> FieldKeys:
        """How each categorical field's values become keys: salted with the field's name,
        or its table's when the table has ``shared_keys``; with several tables, tagged with
        the table's index."""
        tables = self.embedding_tables()
        at = self.field_tables()
        names = self.data.schema.categorical_names
        salts = tuple(
            tables[t].name if tables[t].shared_keys else f for f, t in zip(names, at, strict=True)
        )
        return FieldKeys(salts, at if len(tables) > 1 else None)

    @property
    def several_tables(self) -> bool:
        """True when the fields are spread over more than one embedding table."""
        return len(self.embedding_tables()) > 1


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> RunConfig:
    """Read, override and validate the run config in ``path``.

    Raises
    ------
    ConfigError
        Naming the file, the line where known, the dotted key and what is allowed.
    """
    raw, lines = load_yaml_with_lines(path)
    raw, overridden = apply_overrides(raw, overrides, str(path))
    name = re.sub(r"[^\w.-]", "-", Path(path).stem).lstrip(".") or "daskhps"
    return _parse(raw, Ctx(str(path), lines, overridden), name)


def _parse(d: Mapping[str, Any], ctx: Ctx, default_name: str) -> RunConfig:
    d = ctx.mapping(d, SECTIONS, "")
    run = RunSection.parse(d.get("run"), ctx, default_name)
    model_raw = d.get("model")
    if model_raw is None or (isinstance(model_raw, Mapping) and "name" not in model_raw):
        model_raw = {"name": "dlrm", **(model_raw or {})}  # dlrm unless named
    with ctx.section("model"):
        model = ModelSpec.from_dict(model_raw, ctx.source, "model")
    data = DataConfig.parse(d.get("data"), ctx, run.dir, run.seed)
    passes = PassesConfig.parse(d.get("passes"), ctx)
    table = TableConfig.parse(d.get("table"), ctx, run.dir, run.seed)
    schema = data.schema
    cfg = RunConfig(
        run=run,
        data=data,
        passes=passes,
        table=table,
        tables=parse_tables(
            d.get("tables"), ctx, schema.categorical_names, schema.dense_names, table
        ),
        model=model,
        dense_optimizer=DenseOptimizerConfig.parse(d.get("dense_optimizer"), ctx),
        cluster=ClusterConfig.parse(d.get("cluster"), ctx),
        eval=EvalConfig.parse(d.get("eval"), ctx),
        checkpoint=CheckpointConfig.parse(d.get("checkpoint"), ctx),
        retrain=RetrainConfig.parse(d.get("retrain"), ctx),
        storage=StorageConfig.parse(d.get("storage"), ctx),
        source=ctx.source,
        origins=_origins(d, ctx),
    )
    _check(cfg, ctx)
    # Every command reads and writes through fsspec with these (the workers get them from
    # the cluster's setup plugin): the driver lists logs before any cluster exists.
    use_options(cfg.storage.options)
    return cfg


def _origins(d: Mapping[str, Any], ctx: Ctx) -> Ctx:
    """``ctx`` with the keys ``d`` writes, and those whose value is another key's: a table
    entry's left to the table section, ``table.seed`` left to ``run.seed``."""
    taken = taken_from_table(d.get("tables"))
    table = d.get("table")
    if not isinstance(table, Mapping) or table.get("seed") is None:
        taken["table.seed"] = "run.seed"  # TableConfig's default (and its null)
    return replace(ctx, written=values_written(d), taken=taken)


def _check(cfg: RunConfig, ctx: Ctx) -> None:
    """Checks that need more than one section."""
    specs = cfg.table_specs()  # cannot fail: the declarations hold TableSpec's checks
    tiers, cluster, plan = cfg.table.tiers, cfg.cluster, cfg.passes.plan
    workers = cluster.n_workers if cluster.local else None  # unknown behind an address
    if workers is not None and plan.global_batch_size < workers:
        raise ctx.error(
            "passes.global_batch_size",
            f"{plan.global_batch_size} is smaller than cluster.n_workers ({workers}); "
            "every worker needs a share of each global batch",
        )
    device = tiers.device
    if device.rows is not None and plan.max_working_set is not None and workers is not None:
        # A pass's keys are spread over the workers' shards; even a perfect spread needs this.
        need = math.ceil(plan.max_working_set / workers)
        if device.rows < need:
            raise ctx.error(
                "table.tiers.device.rows",
                f"{device.rows} rows cannot hold a pass: passes.max_working_set "
                f"{plan.max_working_set} keys over {workers} workers is >= {need} per worker; "
                "raise device.rows (about 2x the share leaves room to stage the next pass) or "
                "lower passes.max_working_set",
            )
    # With cluster.gpu: true the device tier lives in GPU memory (auto may find none). Every
    # table has its tiers on every worker.
    over = cfg.tier_sizing().over_budget(
        list(specs), cluster.memory_limit, on_gpu=cluster.gpu is True, policy=tiers.policy
    )
    if over and len(specs) > 1:
        names = ", ".join(s.name for s in specs)
        over += (
            f"; each of the {len(specs)} tables ({names}) has tiers on every worker (fractions "
            "are shared between them, device.rows is each table's)"
        )
    if over:
        own = [i for i, t in enumerate(cfg.tables) if t.tiers is not None]
        raise ctx.error(f"tables[{own[0]}].tiers" if own else "table.tiers", over)
    if len(set(cfg.field_dims())) > 1:  # a model that reads one width for every field says so
        try:
            cfg.build_model()
        except ConfigError as e:
            why = e.__cause__ if isinstance(e.__cause__, ConfigError) else e  # without the origin
            if not isinstance(why, UnequalWidthsError):
                raise ctx.error("model.name", str(why)) from None
            tables = "; ".join(f"table {t.name!r}: dim {t.dim}" for t in cfg.embedding_tables())
            widths = f"{list_widths(why.field_dims)} ({tables})"  # tables, not field numbers
            raise ctx.error(f"model.{why.key}", why.saying(widths)) from None

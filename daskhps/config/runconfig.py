"""The whole run configuration: a frozen tree of sections, loaded from YAML and checked
across sections (memory fractions, tier sizes against the plan, backend against devices)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from daskhps.config.training import DenseOptimizerConfig, EvalConfig, PassesConfig
from daskhps.models.spec import ModelSpec
from daskhps.options import Ctx
from daskhps.storage import use_options
from daskhps.table.spec import TableSpec
from daskhps.tier_sizing import MEMORY_BUDGET  # daskhps.config.MEMORY_BUDGET

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
        """Floats per key the model reads: ``table.dim`` plus the model's extra columns."""
        return self.model.sparse_dim(self.table.dim)

    def table_spec(self) -> TableSpec:
        """The :class:`TableSpec` of the run's table (row width from the model)."""
        t = self.table
        return TableSpec(t.name, self.sparse_dim, t.optimizer, t.seed, t.init_scale)


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
    cfg = RunConfig(
        run=run,
        data=DataConfig.parse(d.get("data"), ctx, run.dir, run.seed),
        passes=PassesConfig.parse(d.get("passes"), ctx),
        table=TableConfig.parse(d.get("table"), ctx, run.dir, run.seed),
        model=model,
        dense_optimizer=DenseOptimizerConfig.parse(d.get("dense_optimizer"), ctx),
        cluster=ClusterConfig.parse(d.get("cluster"), ctx),
        eval=EvalConfig.parse(d.get("eval"), ctx),
        checkpoint=CheckpointConfig.parse(d.get("checkpoint"), ctx),
        retrain=RetrainConfig.parse(d.get("retrain"), ctx),
        storage=StorageConfig.parse(d.get("storage"), ctx),
        source=ctx.source,
    )
    _check(cfg, ctx)
    # Every command reads and writes through fsspec with these (the workers get them from
    # the cluster's setup plugin): the driver lists logs before any cluster exists.
    use_options(cfg.storage.options)
    return cfg


def _check(cfg: RunConfig, ctx: Ctx) -> None:
    """Checks that need more than one section."""
    spec = cfg.table_spec()  # cannot fail: table's declaration holds TableSpec's checks
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
    # With cluster.gpu: true the device tier lives in GPU memory (auto may find none).
    over = tiers.sizing.over_budget(
        [spec], cluster.memory_limit, on_gpu=cluster.gpu is True, policy=tiers.policy
    )
    if over:
        raise ctx.error("table.tiers", over)

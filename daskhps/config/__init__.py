"""Run configuration: YAML -> a validated, frozen :class:`RunConfig`.

::

    RunConfig
      run              RunSection            name, dir, seed, quiet
      data             DataConfig            train | generate, schema, bad_rows, holdout, backend
      passes           PassesConfig          epochs + PassConfig (examples_per_pass, ...)
      table            TableConfig           name, dim, optimizer, seed, init_scale, tiers
      tables           (TableEntry, ...)     more tables: name, dim, features, shared_keys, ...
      model            ModelSpec             name, options
      dense_optimizer  DenseOptimizerConfig  kind, lr, weight_decay, schedule, ...
      cluster          ClusterConfig         address | local settings, gpu, dist_backend, ...
      eval             EvalConfig            every_pass, batch_size, metrics

Each option is declared once, as a field of its section's pydantic model
(:class:`daskhps.options.Options`); loading, ``--set``, ``daskhps config`` (and ``--schema``)
and the reference in docs/configuration.md are read from those declarations. Every error is a
:class:`~daskhps.errors.ConfigError` naming the file, the line where known, the dotted key and
what is allowed.
"""

from __future__ import annotations

from daskhps.config.cluster import ClusterConfig
from daskhps.config.data import DataConfig, GenerateConfig, HoldoutConfig
from daskhps.config.overrides import apply_overrides, parse_override
from daskhps.config.run import RunSection
from daskhps.config.runconfig import MEMORY_BUDGET, RunConfig, load_config
from daskhps.config.table import DeviceTierConfig, HostTierConfig, TableConfig, TiersConfig
from daskhps.config.tables import TableEntry
from daskhps.config.training import DenseOptimizerConfig, EvalConfig, PassesConfig

__all__ = [
    "MEMORY_BUDGET",
    "ClusterConfig",
    "DataConfig",
    "DenseOptimizerConfig",
    "DeviceTierConfig",
    "EvalConfig",
    "GenerateConfig",
    "HoldoutConfig",
    "HostTierConfig",
    "PassesConfig",
    "RunConfig",
    "RunSection",
    "TableConfig",
    "TableEntry",
    "TiersConfig",
    "apply_overrides",
    "load_config",
    "parse_override",
]

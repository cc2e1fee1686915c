"""The tree of every key a run config accepts, built from the sections' own key lists, so the
override checker and the reference cannot drift from what the loader enforces."""

from __future__ import annotations

from typing import Any

from daskhps.config.checkpoint import CheckpointConfig
from daskhps.config.cluster import ClusterConfig, ClusterSecurity
from daskhps.config.data import DataConfig, GenerateConfig, HoldoutConfig
from daskhps.config.retrain import RetrainConfig
from daskhps.config.run import RunSection
from daskhps.config.storage import StorageConfig
from daskhps.config.table import (
    AdmissionConfig,
    DeviceTierConfig,
    ExpiryConfig,
    HostTierConfig,
    TableConfig,
    TiersConfig,
)
from daskhps.config.tables import TableEntry, TableTiersConfig
from daskhps.config.training import DenseOptimizerConfig, EvalConfig, PassesConfig
from daskhps.data.badrows import BadRowPolicy
from daskhps.data.source import TrainLogs
from daskhps.options import Options
from daskhps.table.optimizers import OptimizerSpec

__all__ = ["FREE", "LISTS", "SECTIONS", "all_keys", "key_tree", "section_models"]

FREE = "<free-form>"  # a mapping whose keys are checked by its component (schema, options)
# Sections that are lists of mappings: the key tree holds an entry's keys (``tables.dim`` is
# the dim of each entry), and each maps to the section whose value it takes when left out.
LISTS = {"tables": "table"}
SECTIONS = (
    "run",
    "data",
    "passes",
    "table",
    "tables",
    "model",
    "dense_optimizer",
    "cluster",
    "eval",
    "checkpoint",
    "retrain",
    "storage",
)


def section_models() -> dict[str, type[Options]]:
    """The declaration of every section but ``model`` (a name and free-form options, checked
    against the model's class by :class:`~daskhps.models.spec.ModelSpec`); of a list section
    (:data:`LISTS`), its entries'."""
    return {
        "run": RunSection,
        "data": DataConfig,
        "passes": PassesConfig,
        "table": TableConfig,
        "tables": TableEntry,
        "dense_optimizer": DenseOptimizerConfig,
        "cluster": ClusterConfig,
        "eval": EvalConfig,
        "checkpoint": CheckpointConfig,
        "retrain": RetrainConfig,
        "storage": StorageConfig,
    }


def _node(keys: tuple[str, ...], **sub: Any) -> dict[str, Any]:
    unknown = set(sub) - set(keys)
    assert not unknown, unknown  # a subsection must be one of the section's keys
    return {k: sub.get(k) for k in keys}


def key_tree() -> dict[str, Any]:
    """``{key: None (a value) | FREE | {subkey: ...}}`` for the whole config."""
    return {
        "run": _node(RunSection.key_names()),
        "data": _node(
            DataConfig.key_names(),
            train=_node(TrainLogs.key_names()),
            generate=_node(GenerateConfig.key_names()),
            schema=FREE,
            bad_rows=_node(BadRowPolicy.key_names()),
            holdout=_node(HoldoutConfig.key_names()),
        ),
        "passes": _node(PassesConfig.key_names()),
        "table": _node(
            TableConfig.key_names(),
            optimizer=_node(OptimizerSpec.key_names()),
            admission=_node(AdmissionConfig.key_names()),
            expiry=_node(ExpiryConfig.key_names()),
            tiers=_node(
                TiersConfig.key_names(),
                device=_node(DeviceTierConfig.key_names()),
                host=_node(HostTierConfig.key_names()),
            ),
        ),
        "tables": _node(
            TableEntry.key_names(),
            optimizer=_node(OptimizerSpec.key_names()),
            admission=_node(AdmissionConfig.key_names()),
            expiry=_node(ExpiryConfig.key_names()),
            tiers=_node(
                TableTiersConfig.key_names(),
                device=_node(DeviceTierConfig.key_names()),
                host=_node(HostTierConfig.key_names()),
            ),
        ),
        "model": {"name": None, "options": FREE},
        "dense_optimizer": _node(DenseOptimizerConfig.key_names()),
        "cluster": _node(ClusterConfig.key_names(), security=_node(ClusterSecurity.key_names())),
        "eval": _node(EvalConfig.key_names()),
        "checkpoint": _node(CheckpointConfig.key_names()),
        "retrain": _node(RetrainConfig.key_names()),
        "storage": {"options": FREE},
    }


def all_keys(tree: dict[str, Any] | None = None, prefix: str = "") -> list[str]:
    """Every dotted key, sections included, in document order."""
    out: list[str] = []
    for k, v in (key_tree() if tree is None else tree).items():
        path = f"{prefix}.{k}" if prefix else k
        out.append(path)
        if isinstance(v, dict):
            out.extend(all_keys(v, path))
    return out


def free_form(path: str) -> bool:
    """True when ``path`` lies inside a free-form mapping (e.g. ``model.options.top_mlp``)."""
    node: Any = key_tree()
    for part in path.split("."):
        if node == FREE:
            return True
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return False

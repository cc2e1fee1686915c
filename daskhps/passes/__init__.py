"""Pass planning: passes, global batches per worker, unique keys per owner on its worker."""

from __future__ import annotations

from daskhps.passes.config import PassConfig
from daskhps.passes.owners import (
    OwnerPlacement,
    owner_keys,
    pass_keys,
    place_on_workers,
    plan_owner_keys,
    select_examples,
    worker_addresses,
)
from daskhps.passes.plan import PassPlan, PassSpec, build_plan, split_batch

__all__ = [
    "OwnerPlacement",
    "PassConfig",
    "PassPlan",
    "PassSpec",
    "build_plan",
    "owner_keys",
    "pass_keys",
    "place_on_workers",
    "plan_owner_keys",
    "select_examples",
    "split_batch",
    "worker_addresses",
]

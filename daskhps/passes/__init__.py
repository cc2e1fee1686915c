"""Pass planning: passes, global batches per worker, unique keys per owner on its worker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from daskhps._lazy import lazy_attribute
from daskhps.passes.config import PassConfig

if TYPE_CHECKING:
    from daskhps.passes.keys import pass_keys, select_examples
    from daskhps.passes.owners import owner_keys, plan_owner_keys, worker_addresses
    from daskhps.passes.placement import OwnerPlacement, place_on_workers, place_together
    from daskhps.passes.plan import PassPlan, PassSpec, build_plan, split_batch

# The planning modules build Dask graphs: they are loaded on first use of their names, so that
# daskhps.config (which needs PassConfig, and runs this file first) does not import dask.
_LAZY = {
    "pass_keys": "keys",
    "select_examples": "keys",
    "OwnerPlacement": "placement",
    "owner_keys": "owners",
    "place_on_workers": "placement",
    "place_together": "placement",
    "plan_owner_keys": "owners",
    "worker_addresses": "owners",
    "PassPlan": "plan",
    "PassSpec": "plan",
    "build_plan": "plan",
    "split_batch": "plan",
}

__all__ = [
    "OwnerPlacement",
    "PassConfig",
    "PassPlan",
    "PassSpec",
    "build_plan",
    "owner_keys",
    "pass_keys",
    "place_on_workers",
    "place_together",
    "plan_owner_keys",
    "select_examples",
    "split_batch",
    "worker_addresses",
]


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name)

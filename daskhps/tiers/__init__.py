"""Tiers of the hierarchy: device cache -> host memory -> zarr store on local disk."""

from __future__ import annotations

from daskhps.tiers.base import (
    Cache,
    CommitInfo,
    CompactReport,
    Evicted,
    Lookup,
    PersistentStore,
    Tier,
    TierStats,
)
from daskhps.tiers.device import DeviceCache
from daskhps.tiers.host import HostMemory, rows_for_bytes
from daskhps.tiers.zarr_store import ZarrStore

__all__ = [
    "Cache",
    "CommitInfo",
    "CompactReport",
    "DeviceCache",
    "Evicted",
    "HostMemory",
    "Lookup",
    "PersistentStore",
    "Tier",
    "TierStats",
    "ZarrStore",
    "rows_for_bytes",
]

"""Tiers of the hierarchy: device cache -> host memory -> zarr store on local disk."""

from __future__ import annotations

from daskhps.tiers.base import Evicted, Lookup, Tier, TierStats
from daskhps.tiers.device import DeviceCache
from daskhps.tiers.host import HostMemory, rows_for_bytes
from daskhps.tiers.zarr_store import CommitInfo, CompactReport, ZarrStore

__all__ = [
    "CommitInfo",
    "CompactReport",
    "DeviceCache",
    "Evicted",
    "HostMemory",
    "Lookup",
    "Tier",
    "TierStats",
    "ZarrStore",
    "rows_for_bytes",
]

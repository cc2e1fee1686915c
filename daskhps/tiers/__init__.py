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
from daskhps.tiers.store import StoreReader, StoreWriter, open_store

__all__ = [
    "Cache",
    "CommitInfo",
    "CompactReport",
    "DeviceCache",
    "Evicted",
    "HostMemory",
    "Lookup",
    "PersistentStore",
    "StoreReader",
    "StoreWriter",
    "Tier",
    "TierStats",
    "open_store",
    "rows_for_bytes",
]

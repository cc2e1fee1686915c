"""Tiers of the hierarchy: device cache -> host memory -> zarr store on local disk."""

from __future__ import annotations

from daskhps.tiers.base import Evicted, Lookup, Tier, TierStats

__all__ = ["Evicted", "Lookup", "Tier", "TierStats"]

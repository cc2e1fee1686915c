"""How a store writes: the one declaration of its tunables, carried from the run config
(``table.tiers.snapshot_every``) through the worker's shards and the table to the store."""

from __future__ import annotations

from pydantic import Field

from daskhps.options import Int, Options

__all__ = ["StoreOptions"]


class StoreOptions(Options):
    """The writing side of a store; none of these change what a store holds, only its files."""

    snapshot_every: Int = Field(8, ge=1)
    """Commits between full index snapshots; in between a commit records only the segments
    written since, and opening replays them."""
    chunk_rows: Int = Field(65536, ge=1)
    """Rows per chunk file of new segments."""
    write_buffer_rows: Int = Field(65536, ge=0)
    """Small upserts (evictions in the middle of a pass) collect in an open segment in memory,
    written out once it holds this many rows, or at ``flush`` / ``commit``: one zarr array per
    eviction batch would cost milliseconds each and scatter a pass's rows over hundreds of tiny
    files. Lookups read the open segment like any other."""

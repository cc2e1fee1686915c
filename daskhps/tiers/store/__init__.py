"""The persistent bottom tier: one shard of one table in an append-only zarr v3 store."""

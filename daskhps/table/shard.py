"""Opening one shard of a table: its zarr store and the caches above it, held as a
:class:`Shard` that every operation of :class:`~daskhps.table.EmbeddingTable` works on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from daskhps.errors import CapacityError, DataError
from daskhps.table.read_path import ReadPath
from daskhps.table.spec import TableSpec
from daskhps.tiers.base import Cache, PersistentStore, check_keys
from daskhps.tiers.device import DeviceCache
from daskhps.tiers.host import HostMemory, rows_for_bytes
from daskhps.tiers.store import StoreOptions, StoreReader, open_store

__all__ = ["Shard", "open_caches", "open_shard_store", "open_tiers"]


@dataclass(eq=False)
class Shard:
    """The tier stack of one shard and the state its operations share."""

    spec: TableSpec
    store: PersistentStore
    device_cache: Cache
    host: Cache | None
    read: ReadPath
    read_only: bool
    # per device slot: a key this pass must not train (admission's freeze), or None
    frozen: torch.Tensor | None = None

    @classmethod
    def of(
        cls, spec: TableSpec, store: PersistentStore, device_cache: Cache, host: Cache | None
    ) -> Shard:
        read = ReadPath(spec, device_cache, host, store, write_back=store.upsert)
        return cls(spec, store, device_cache, host, read, store.read_only)

    @property
    def device(self) -> torch.device:
        return self.device_cache.device

    @property
    def sources(self) -> dict[str, int]:
        """Where rows came from: the read path counts below the device, callers the hits."""
        return self.read.rows_from

    def where(self, op: str) -> str:
        return f"table {self.spec.name!r} ({self.store.path}), {op}"

    def check_writable(self, op: str) -> None:
        if self.read_only:
            raise DataError(
                f"{self.where(op)}: the table was opened read-only (mode='r'); "
                "open it with mode='a' to train, or use lookup(keys, read_only=True)"
            )

    def device_keys(self, keys: torch.Tensor, op: str) -> torch.Tensor:
        """``keys`` checked (int64, one dimension) and on the device tier's device."""
        return check_keys(keys, self.where(op)).to(self.device)


def open_caches(
    spec: TableSpec,
    *,
    device_rows: int,
    host_bytes: int,
    device: torch.device,
    policy: Literal["lru", "lfu"],
) -> tuple[Cache, Cache | None]:
    """The device cache of ``device_rows`` rows and, when ``host_bytes`` holds a row, the
    host-memory tier."""
    cache = DeviceCache(
        f"{spec.name}/device", spec.width, device_rows, device=device, policy=policy
    )
    host = None
    if rows_for_bytes(spec.width, host_bytes, policy) > 0:
        host = HostMemory(f"{spec.name}/host", spec.width, host_bytes, policy=policy)
    return cache, host


def check_device_rows(spec: TableSpec, device_rows: int) -> None:
    if device_rows < 1:
        raise CapacityError(
            f"table {spec.name!r}: device_rows must be >= 1, got {device_rows}; "
            "give the device tier room for at least one pass's working set"
        )


def open_tiers(
    spec: TableSpec,
    path: str | Path,
    *,
    device_rows: int,
    host_bytes: int,
    device: str | torch.device,
    policy: Literal["lru", "lfu"],
    mode: Literal["w", "a", "r"],
    commit: str | None,
    store: StoreOptions | None,
) -> tuple[StoreReader, Cache, Cache | None]:
    """The store of the shard at ``path`` (created when ``mode`` allows) and the caches above
    it. Nothing is created for arguments that are wrong, and the store is closed again when
    the caches cannot be made."""
    dev = torch.device(device)
    check_device_rows(spec, device_rows)
    opened = open_shard_store(spec, path, mode=mode, commit=commit, options=store)
    try:
        cache, host = open_caches(
            spec, device_rows=device_rows, host_bytes=host_bytes, device=dev, policy=policy
        )
    except BaseException:
        opened.close()
        raise
    return opened, cache, host


def open_shard_store(
    spec: TableSpec, path: str | Path, *, label: str | None = None, **kwargs: Any
) -> StoreReader:
    """The zarr store of one shard of ``spec``'s table at ``path``, with the table's row width
    and layout (a store written with another layout is refused); ``kwargs`` go to
    :func:`daskhps.tiers.store.open_store` (``mode``, ``commit``, ...): a reader for
    ``mode="r"``, else a writer. ``label`` names it in messages (default ``<table>/zarr``)."""
    return open_store(
        path,
        name=label or f"{spec.name}/zarr",
        width=spec.width,
        layout=spec.layout(),
        **kwargs,
    )

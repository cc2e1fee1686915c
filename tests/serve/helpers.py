"""Real sharded table versions on disk for the serving tests, and their reference rows."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tornado.netutil

from daskhps.retrain.publish import freeze_version
from daskhps.retrain.versions import Attempt, Registry, Version
from daskhps.runfiles.checkpoint import Checkpoint
from daskhps.serve import TableVersion
from daskhps.serve.client import ServeClient
from daskhps.serve.server import ServeOptions, Server
from daskhps.sharding import ShardMap
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec

SPEC = TableSpec("emb", 4, OptimizerSpec(kind="adagrad", lr=0.1), seed=7)
SHARDS = 8


def version(stores: Path, commit: str, workers: int = 2, spec: TableSpec = SPEC) -> TableVersion:
    return TableVersion(stores, spec, workers, SHARDS, commit)


def train_commit(
    stores: Path,
    keys: torch.Tensor,
    commit: str,
    *,
    workers: int = 2,
    spec: TableSpec = SPEC,
    seed: int = 0,
    from_commit: str | None = None,
) -> None:
    """Apply one random gradient to ``keys`` (routed to their rank stores) and commit."""
    owner = ShardMap(SHARDS, workers).worker(keys)
    gen = torch.Generator().manual_seed(seed)
    grads = torch.randn(len(keys), spec.dim, generator=gen)
    for r in range(workers):
        mine = owner == r
        path = stores / spec.name / f"rank-{r}"
        with EmbeddingTable.open(spec, path, device_rows=100_000, commit=from_commit) as t:
            if bool(mine.any()):
                t.apply_gradients(keys[mine], grads[mine])
            t.commit(commit)


def reference_rows(v: TableVersion, keys: torch.Tensor) -> torch.Tensor:
    """Full rows of ``keys`` at ``v``, read with the table's own read-only peek."""
    owner = v.shard_map.worker(keys)
    out = torch.empty(len(keys), v.spec.width)
    for r in range(v.num_workers):
        mine = (owner == r).nonzero().squeeze(1)
        with EmbeddingTable.open(
            v.spec, v.store_path(r), device_rows=1, mode="r", commit=v.commit
        ) as t:
            out[mine] = t.peek(keys[mine])
    return out


def bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int32).numpy()


def tree_state(folder: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under ``folder``: unchanged means nothing was written."""
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            st = os.stat(os.path.join(root, f))
            out[os.path.join(root, f)] = (st.st_size, st.st_mtime_ns)
    return out


def publish_checkpoint(registry: Registry, name: str, ckpt: Checkpoint) -> None:
    """Freeze ``ckpt`` as version ``name`` under the registry's folder and make it current, as
    a retraining day that passed its gates does."""
    frozen = freeze_version(ckpt, registry.folder / name, name)
    days = ("2024-01-01",)
    registry.publish(
        Version(name, str(frozen.path), frozen.commit, str(frozen.stores_dir), None, days,
                days[0], "2024-01-02"),
        Attempt(f"a-{name}", None, days, "2024-01-02", "published", name),
    )  # fmt: skip


class Running:
    """A :class:`Server` on its own IO loop thread, on a free loopback port."""

    def __init__(self, options: ServeOptions) -> None:
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = Server(options)

        async def start() -> None:
            self.server.start(sockets)

        asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)
        self.client = ServeClient(f"http://127.0.0.1:{self.port}")
        self.client.wait_ready(120)

    def refresh(self) -> Any:
        return asyncio.run_coroutine_threadsafe(self.server.refresh_once(), self.loop).result(120)

    def close(self) -> None:
        self.client.close()
        self.loop.call_soon_threadsafe(self.server.stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)

"""The memory model against the real objects' own byte counts, for several row layouts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from daskhps.capacity.estimate import (
    dense_bytes,
    host_tier_bytes,
    index_bytes_holding,
    index_scratch_bytes,
    index_transient_bytes,
    slot_cache_bytes,
)
from daskhps.models import ModelSpec
from daskhps.table import EmbeddingTable, TableSpec
from daskhps.table.optimizers import OptimizerSpec

LAYOUTS = [
    (4, OptimizerSpec(kind="sgd")),
    (16, OptimizerSpec(kind="adagrad")),
    (16, OptimizerSpec(kind="adagrad", row_wise=True)),
    (32, OptimizerSpec(kind="adam")),
]


@pytest.mark.parametrize(("dim", "opt"), LAYOUTS)
@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_tiers_match_the_tables_stats(
    tmp_path: Path, dim: int, opt: OptimizerSpec, policy: str
) -> None:
    spec = TableSpec("t", dim, opt)
    rows, host_budget, n = 3000, 200_000, 5000
    with EmbeddingTable.open(
        spec,
        tmp_path / "s",
        device_rows=rows,
        host_bytes=host_budget,
        policy=policy,  # type: ignore[arg-type]
    ) as table:
        keys = torch.randperm(10**6)[:n].to(torch.int64)
        for part in keys.split(rows // 2):  # fills the device tier, spills to host and store
            table.stage(part)
            table.unpin()
        table.flush()
        stats = table.stats()
        device = slot_cache_bytes(rows, spec.width, policy)
        host = host_tier_bytes(host_budget, spec.width, policy)
        assert host is not None
        assert stats["device"]["bytes"] == device.resident
        assert stats["device"]["index_bytes"] == device.index
        assert stats["host"]["bytes"] == host.resident
        assert stats["host"]["capacity_rows"] == host.rows
        assert host.resident <= host_budget
        # Scratch: the largest lookup the device index saw was one staged batch.
        assert stats["device"]["index_scratch_bytes"] == index_scratch_bytes(rows // 2)
        assert stats["store"]["index_bytes"] == index_bytes_holding(len(table.store))


def test_store_index_growth_is_modelled_for_many_sizes() -> None:
    from daskhps.tiers.index import KeyIndex

    index = KeyIndex(1024)
    for total in (500, 3000, 20_000, 70_000):
        have = len(index)
        new = torch.arange(have, total, dtype=torch.int64) * 7919 + 1
        for part in new.split(256):  # small eviction batches: every growth doubles
            index.put(part, part)
        assert index.nbytes == index_bytes_holding(total), total
    # One large insert grows straight to its size: the model is an upper bound then.
    big = KeyIndex(1024)
    keys = torch.arange(50_000, dtype=torch.int64)
    big.put(keys, keys)
    assert big.nbytes <= index_bytes_holding(50_000) < 2 * big.nbytes


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_dense_bytes_match_torch_optimizer_state(kind: str) -> None:
    model = ModelSpec("dlrm").build(num_dense=13, num_fields=26, embedding_dim=8)
    params = list(model.parameters())
    opt = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}[kind](
        params, lr=0.01
    )
    out = model(torch.randn(4, 13), torch.randn(4, 26, 8))
    out.sum().backward()
    opt.step()
    real = sum(p.nbytes + p.grad.nbytes for p in params if p.grad is not None)
    real += sum(
        v.nbytes
        for s in opt.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    assert dense_bytes(sum(p.numel() for p in params), kind) == real


def test_scratch_is_capped_by_the_probe_chunk() -> None:
    assert index_scratch_bytes(0) == 0
    assert index_scratch_bytes(10) == index_scratch_bytes(1024)
    assert index_scratch_bytes(10**8) == index_scratch_bytes(1 << 19)


@pytest.mark.parametrize("keys", [40_000, 700_000])
def test_index_growth_allocates_what_the_model_bounds(keys: int) -> None:
    """A growth of the store's index, counted by live tensor storage: the new table, its items
    and the insert's temporaries (in chunks), not hundreds of bytes per key at once."""
    from daskhps.capacity.activations import PeakLiveBytes
    from daskhps.tiers.index import KeyIndex

    index = KeyIndex(1024)
    full = int(index.load_factor * index.slots)
    while full < keys:  # as evictions write rows: growth by doubling
        part = torch.arange(len(index), len(index) + 16384, dtype=torch.int64) * 7919 + 1
        index.put(part, part)
        full = int(index.load_factor * index.slots)
    part = torch.arange(len(index), full, dtype=torch.int64) * 7919 + 1
    for p in part.split(4096):
        index.put(p, p)
    assert len(index) == full and index_bytes_holding(full) == index.nbytes
    one = torch.tensor([-5], dtype=torch.int64)
    with PeakLiveBytes() as counter:
        index.put(one, one)  # the insert that grows it
    new_table = index.nbytes
    assert new_table == index_bytes_holding(full + 1) > index_bytes_holding(full)
    grown_at = full + 1
    # What the growth allocates: at least the new table; at most what the model says the
    # index holds at that moment (it also counts the old table, made before the block).
    assert new_table <= counter.peak <= new_table + index_transient_bytes(grown_at)
    # Grown in chunks, it still holds every key with its value.
    stored = torch.cat([torch.arange(full, dtype=torch.int64) * 7919 + 1, one])
    values, found = index.get(stored)
    assert bool(found.all()) and torch.equal(values, stored)

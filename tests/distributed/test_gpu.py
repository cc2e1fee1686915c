"""CUDA paths: nccl groups and a device tier in GPU memory (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from daskhps.distributed import Comm, Exchange, TierSizing, WorkerShards
from daskhps.sharding import ShardMap
from daskhps.table import EmbeddingTable
from tests.distributed import _ranks

pytestmark = pytest.mark.gpu


def test_single_rank_exchange_on_the_gpu(tmp_path):
    comm = Comm.create(0, 1, device="cuda")
    assert comm.backend == "nccl"
    ex = Exchange(comm, ShardMap(4, 1))
    keys = torch.tensor([7, 3, 7, 11])
    with EmbeddingTable.open(_ranks.SPEC, tmp_path / "t", device_rows=64, device="cuda") as t:
        routing = ex.route(keys)
        rows = ex.pull_rows(routing, t.lookup)
        assert rows.device.type == "cuda"
        assert torch.equal(rows[routing.inverse].cpu(), t.lookup(keys, read_only=True).cpu())
        ex.push_grads(routing, torch.ones_like(rows), t.apply_gradients)


def test_device_fraction_is_of_gpu_memory(tmp_path):
    got = TierSizing(device_fraction=0.01).resolve([_ranks.SPEC], None, device="cuda")
    total = torch.cuda.get_device_properties(0).total_memory
    rows = got[_ranks.SPEC.name][0]
    assert 0 < rows * _ranks.SPEC.row_bytes <= 0.01 * total
    shards = WorkerShards([_ranks.SPEC], tmp_path, TierSizing(device_rows=100), device="cuda")
    assert shards.device == "cuda"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (one per nccl rank)")
def test_nccl_group_of_two(tmp_path):
    mp.spawn(_ranks.run_nccl, args=(2, str(tmp_path)), nprocs=2, join=True)
    outs = [torch.load(tmp_path / f"nccl-{r}.pt") for r in range(2)]
    for o in outs:
        assert torch.all(o["sum"] == 3.0)
        assert o["got"].tolist() == [0.0, 1.0, 1.0]

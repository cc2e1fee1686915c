"""On CUDA the models and pooling compute what they compute on the CPU (within float tolerance)."""

from __future__ import annotations

import copy

import pytest
import torch

from daskhps.models import BUILTIN_MODELS, build_model, pool

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_forward_backward_cuda_equals_cpu(name: str) -> None:
    torch.manual_seed(0)
    cpu = build_model(name, num_dense=5, num_fields=6, embedding_dim=8)
    gpu = copy.deepcopy(cpu).cuda()
    gen = torch.Generator().manual_seed(1)
    dense = torch.randn(64, 5, generator=gen)
    sparse = torch.randn(64, 6, cpu.sparse_dim(8), generator=gen)
    sparse_cpu = sparse.clone().requires_grad_(True)
    sparse_gpu = sparse.cuda().requires_grad_(True)

    out_cpu = cpu(dense, sparse_cpu)
    out_gpu = gpu(dense.cuda(), sparse_gpu)
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, rtol=1e-4, atol=1e-5)
    out_cpu.sum().backward()
    out_gpu.sum().backward()
    torch.testing.assert_close(sparse_gpu.grad.cpu(), sparse_cpu.grad, rtol=1e-4, atol=1e-5)
    for (pname, p_cpu), p_gpu in zip(cpu.named_parameters(), gpu.parameters(), strict=True):
        assert p_gpu.grad is not None and p_cpu.grad is not None, pname
        torch.testing.assert_close(p_gpu.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_pool_cuda_equals_cpu(mode: str) -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 4, (300,), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    rows = torch.randn(int(offsets[-1]), 8, generator=gen)
    rows_cpu = rows.clone().requires_grad_(True)
    rows_gpu = rows.cuda().requires_grad_(True)
    out_cpu = pool(rows_cpu, offsets, mode)  # type: ignore[arg-type]
    out_gpu = pool(rows_gpu, offsets.cuda(), mode)  # type: ignore[arg-type]
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, rtol=1e-5, atol=1e-6)
    upstream = torch.randn(out_cpu.shape, generator=gen)
    out_cpu.backward(upstream)
    out_gpu.backward(upstream.cuda())
    torch.testing.assert_close(rows_gpu.grad.cpu(), rows_cpu.grad, rtol=1e-5, atol=1e-6)

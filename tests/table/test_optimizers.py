"""Sparse optimizers against torch.optim on dense parameters, and their in-row state layout."""

from __future__ import annotations

import pytest
import torch

from daskhps.errors import ConfigError
from daskhps.table.optimizers import OptimizerSpec, apply_update, init_state, state_width

DIM = 6


def _run_sparse(spec: OptimizerSpec, w0: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    rows = torch.cat([w0.clone(), init_state(spec, len(w0), DIM, w0.device)], dim=1)
    for g in grads:
        apply_update(spec, rows, g, DIM)
    return rows


def _run_dense(
    opt_cls: type, w0: torch.Tensor, grads: list[torch.Tensor], **kw: float
) -> torch.Tensor:
    p = torch.nn.Parameter(w0.clone())
    opt = opt_cls([p], **kw)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach()


@pytest.fixture
def problem() -> tuple[torch.Tensor, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(5, DIM, generator=gen)
    grads = [torch.randn(5, DIM, generator=gen) for _ in range(20)]
    return w0, grads


def test_sgd_matches_torch(problem: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
    w0, grads = problem
    rows = _run_sparse(OptimizerSpec(kind="sgd", lr=0.1), w0, grads)
    assert rows.shape == (5, DIM)
    dense = _run_dense(torch.optim.SGD, w0, grads, lr=0.1)
    torch.testing.assert_close(rows, dense, rtol=1e-6, atol=1e-6)


def test_adagrad_matches_torch(problem: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
    w0, grads = problem
    spec = OptimizerSpec(kind="adagrad", lr=0.05, eps=1e-10, initial_accumulator=0.1)
    rows = _run_sparse(spec, w0, grads)
    dense = _run_dense(
        torch.optim.Adagrad, w0, grads, lr=0.05, eps=1e-10, initial_accumulator_value=0.1
    )
    torch.testing.assert_close(rows[:, :DIM], dense, rtol=1e-5, atol=1e-6)
    acc = 0.1 + sum(g * g for g in grads)
    torch.testing.assert_close(rows[:, DIM:], acc, rtol=1e-5, atol=1e-6)


def test_rowwise_adagrad_keeps_one_scalar_per_row(
    problem: tuple[torch.Tensor, list[torch.Tensor]],
) -> None:
    w0, grads = problem
    spec = OptimizerSpec(kind="adagrad", lr=0.05, row_wise=True)
    rows = _run_sparse(spec, w0, grads)
    assert rows.shape == (5, DIM + 1)
    w, acc = w0.clone().double(), torch.zeros(5, 1, dtype=torch.float64)
    for g in grads:
        g = g.double()
        acc += (g * g).mean(dim=1, keepdim=True)
        w -= 0.05 * g / (acc.sqrt() + 1e-8)
    torch.testing.assert_close(rows[:, :DIM].double(), w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rows[:, DIM:].double(), acc, rtol=1e-5, atol=1e-6)


def test_adam_matches_torch_and_counts_steps_per_row(
    problem: tuple[torch.Tensor, list[torch.Tensor]],
) -> None:
    w0, grads = problem
    spec = OptimizerSpec(kind="adam", lr=0.01, beta1=0.8, beta2=0.99, eps=1e-8)
    rows = _run_sparse(spec, w0, grads)
    assert rows.shape == (5, 3 * DIM + 1)
    dense = _run_dense(torch.optim.Adam, w0, grads, lr=0.01, betas=(0.8, 0.99), eps=1e-8)
    torch.testing.assert_close(rows[:, :DIM], dense, rtol=1e-5, atol=1e-6)
    steps = rows[:, 3 * DIM :].view(torch.int32)
    assert steps.flatten().tolist() == [20] * 5


def test_adam_is_lazy_rows_keep_their_own_step() -> None:
    spec = OptimizerSpec(kind="adam", lr=0.01)
    rows = _run_sparse(spec, torch.zeros(2, DIM), [])
    g = torch.ones(1, DIM)
    for _ in range(3):
        block = rows[:1].clone()
        apply_update(spec, block, g, DIM)
        rows[:1] = block
    assert rows[:, 3 * DIM :].view(torch.int32).flatten().tolist() == [3, 0]
    assert bool((rows[1] == 0).all())


def test_adam_step_count_is_exact_beyond_float_precision() -> None:
    spec = OptimizerSpec(kind="adam", lr=0.01)
    rows = _run_sparse(spec, torch.zeros(1, DIM), [])
    rows[:, 3 * DIM :].view(torch.int32).fill_(2**24 + 1)
    apply_update(spec, rows, torch.ones(1, DIM), DIM)
    assert rows[0, 3 * DIM :].view(torch.int32).item() == 2**24 + 2


@pytest.mark.parametrize(
    "kind,row_wise,width",
    [
        ("sgd", False, 0),
        ("adagrad", False, DIM),
        ("adagrad", True, 1),
        ("adam", False, 2 * DIM + 1),
    ],
)
def test_state_width(kind: str, row_wise: bool, width: int) -> None:
    assert state_width(OptimizerSpec(kind=kind, row_wise=row_wise), DIM) == width  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"kind": "rmsprop"}, "not one of"),
        ({"kind": "adam", "row_wise": True}, "adagrad only"),
        ({"lr": 0.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"eps": -1.0}, "eps"),
        ({"beta1": 1.0}, "beta1"),
        ({"initial_accumulator": -0.5}, "initial_accumulator"),
    ],
)
def test_bad_optimizer_settings(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        OptimizerSpec(**kw)

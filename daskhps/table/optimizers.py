"""Sparse optimizers whose state lives in the row, beside the embedding.

A row of a table with embedding dim ``d`` is laid out as::

    sgd                 [ w(d) ]
    adagrad             [ w(d) | sum of squared grads(d) ]
    adagrad, row-wise   [ w(d) | mean of squared grads(1) ]    (FBGEMM's row-wise Adagrad)
    adam (lazy)         [ w(d) | m(d) | v(d) | step(1) ]       step: int32 bits in a float32 slot

and the row's statistics follow (:mod:`daskhps.table.stats`). State therefore moves with the
row through every tier, bit for bit. The step count is stored as an int32 bit pattern, not a
float, so it stays exact past 2**24 updates. Every function here is vectorised over a block of
unique rows; duplicate keys are summed by the table first.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from pydantic import Field, field_validator, model_validator

from daskhps.options import Options, Problem

__all__ = ["OptimizerSpec", "apply_update", "state_width"]

OptimizerKind = Literal["sgd", "adagrad", "adam"]
_KINDS: tuple[str, ...] = get_args(OptimizerKind)


class OptimizerSpec(Options):
    """A sparse optimizer and its hyper-parameters (the ``table.optimizer`` section).

    ``kind`` and ``row_wise`` decide the row layout and are stored with the table; the
    hyper-parameters (learning rate, betas, eps) may change between runs.
    """

    kind: OptimizerKind = "adagrad"
    """Sparse optimizer kind."""
    lr: float = Field(0.05, gt=0.0, allow_inf_nan=False)
    """Learning rate of the embeddings (the default suits Adagrad; Adam wants about 0.001)."""
    row_wise: bool = False
    """Adagrad with one accumulator per row."""
    eps: float = Field(1e-8, gt=0.0)
    """Adagrad/Adam epsilon."""
    initial_accumulator: float = Field(0.0, ge=0.0)
    """Adagrad's starting accumulator."""
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    """Adam's first-moment decay."""
    beta2: float = Field(0.999, ge=0.0, lt=1.0)
    """Adam's second-moment decay."""

    @field_validator("kind", mode="before")
    @classmethod
    def _known_kind(cls, kind: Any) -> Any:
        if isinstance(kind, str) and kind not in _KINDS:
            raise Problem("", f"{kind!r} is not one of {', '.join(map(repr, _KINDS))}")
        return kind

    @model_validator(mode="after")
    def _row_wise_is_adagrads(self) -> OptimizerSpec:
        if self.row_wise and self.kind != "adagrad":
            raise Problem("", f"row_wise applies to adagrad only, not {self.kind!r}")
        return self

    def layout(self) -> dict[str, Any]:
        """The fields that decide the row layout (stored with the table, checked on reopen)."""
        return {"optimizer": self.kind, "row_wise": self.row_wise}

    def as_dict(self) -> dict[str, Any]:
        return self.to_dict()


def state_width(spec: OptimizerSpec, dim: int) -> int:
    """Floats of optimizer state per row."""
    if spec.kind == "sgd":
        return 0
    if spec.kind == "adagrad":
        return 1 if spec.row_wise else dim
    return 2 * dim + 1


def init_state(spec: OptimizerSpec, n: int, dim: int, device: torch.device) -> torch.Tensor:
    """Initial optimizer state of ``n`` new rows (zeros; Adagrad's accumulator may start > 0)."""
    state = torch.zeros(n, state_width(spec, dim), dtype=torch.float32, device=device)
    if spec.kind == "adagrad" and spec.initial_accumulator:
        state.fill_(spec.initial_accumulator)
    return state


def apply_update(spec: OptimizerSpec, rows: torch.Tensor, grads: torch.Tensor, dim: int) -> None:
    """Update a block of unique rows in place from their (already summed) gradients.

    Parameters
    ----------
    rows:
        ``float32[u, dim + state_width]``, modified in place.
    grads:
        ``float32[u, dim]``.
    """
    w = rows[:, :dim]
    if spec.kind == "sgd":
        w.add_(grads, alpha=-spec.lr)
    elif spec.kind == "adagrad":
        acc = rows[:, dim : dim + 1] if spec.row_wise else rows[:, dim : 2 * dim]
        if spec.row_wise:
            acc.add_(grads.square().mean(dim=1, keepdim=True))
        else:
            acc.addcmul_(grads, grads)
        w.addcdiv_(grads, acc.sqrt().add_(spec.eps), value=-spec.lr)
    else:
        m = rows[:, dim : 2 * dim]
        v = rows[:, 2 * dim : 3 * dim]
        step_bits = rows[:, 3 * dim : 3 * dim + 1].view(torch.int32)
        step_bits.add_(1)
        t = step_bits.to(torch.float64)
        m.mul_(spec.beta1).add_(grads, alpha=1.0 - spec.beta1)
        v.mul_(spec.beta2).addcmul_(grads, grads, value=1.0 - spec.beta2)
        # Bias corrections in float64: beta2**t loses precision in float32 for large t.
        bc1 = (1.0 - torch.pow(spec.beta1, t)).to(torch.float32)
        bc2_sqrt = (1.0 - torch.pow(spec.beta2, t)).sqrt().to(torch.float32)
        denom = (v.sqrt() / bc2_sqrt).add_(spec.eps)
        w.addcdiv_(m / bc1, denom, value=-spec.lr)

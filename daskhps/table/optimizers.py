"""Sparse optimizers whose state lives in the row, beside the embedding.

A row of a table with embedding dim ``d`` is laid out as::

    sgd                 [ w(d) ]
    adagrad             [ w(d) | sum of squared grads(d) ]
    adagrad, row-wise   [ w(d) | mean of squared grads(1) ]    (FBGEMM's row-wise Adagrad)
    adam (lazy)         [ w(d) | m(d) | v(d) | step(1) ]       step: int32 bits in a float32 slot

State therefore moves with the row through every tier, bit for bit. The step count is stored
as an int32 bit pattern, not a float, so it stays exact past 2**24 updates. Every function
here is vectorised over a block of unique rows; duplicate keys are summed by the table first.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from daskhps.errors import ConfigError

__all__ = ["OptimizerSpec", "apply_update", "state_width"]

OptimizerKind = Literal["sgd", "adagrad", "adam"]
_KINDS = ("sgd", "adagrad", "adam")


@dataclass(frozen=True)
class OptimizerSpec:
    """A sparse optimizer and its hyper-parameters.

    ``kind`` and ``row_wise`` decide the row layout and are stored with the table; the
    hyper-parameters (learning rate, betas, eps) may change between runs.
    """

    kind: OptimizerKind = "adagrad"
    lr: float = 0.01
    row_wise: bool = False
    eps: float = 1e-8
    initial_accumulator: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ConfigError(f"optimizer kind {self.kind!r} is not one of {', '.join(_KINDS)}")
        if self.row_wise and self.kind != "adagrad":
            raise ConfigError(f"row_wise applies to adagrad only, not {self.kind!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"optimizer lr must be a positive number, got {self.lr!r}")
        if not self.eps > 0:
            raise ConfigError(f"optimizer eps must be positive, got {self.eps!r}")
        if self.initial_accumulator < 0:
            raise ConfigError(
                f"optimizer initial_accumulator must be >= 0, got {self.initial_accumulator!r}"
            )
        for name in ("beta1", "beta2"):
            b = getattr(self, name)
            if not 0.0 <= b < 1.0:
                raise ConfigError(f"optimizer {name} must be in [0, 1), got {b!r}")

    def layout(self) -> dict[str, Any]:
        """The fields that decide the row layout (stored with the table, checked on reopen)."""
        return {"optimizer": self.kind, "row_wise": self.row_wise}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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

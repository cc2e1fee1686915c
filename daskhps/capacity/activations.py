"""Bytes a dense model's batch takes while it runs: measured, not guessed, per example.

A training step holds every activation its backward needs, the gradients of the batch's rows
and the loss; an evaluation step (no autograd) holds the layers' outputs only while the next
layer reads them. Both grow linearly with the batch's rows, and how fast depends on the model
(layer widths, DLRM's pairwise interactions, DCN's cross layers). So the plan runs the
configured model once on a small batch, on the CPU, and counts the bytes of every tensor the
step allocates that is still alive after each operation (:class:`PeakLiveBytes`); the peak
over the step, divided by the batch's rows, prices one example::

    train step   dense [B, num_dense] and sparse rows [B, F, S] (the exchange's leaf, which
                 receives gradients) -> forward -> BCE -> backward
    eval step    the same inputs -> forward, under torch.no_grad()

Tensors that exist before the step (the model's weights) are not counted: the plan prices
them as the dense model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from daskhps.config import RunConfig

__all__ = ["PeakLiveBytes", "StepBytes", "step_bytes"]

_PROBE_ROWS = 256  # large enough that per-batch constants (biases, scalars) vanish per row


class PeakLiveBytes(TorchDispatchMode):
    """The most bytes of tensor storage allocated inside the ``with`` block alive at once.

    Every operation's outputs are recorded by storage (views share their base's bytes); a
    storage counts until it is freed, which the next operation sees through a weak reference,
    so a temporary counts at the operation that made it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[StorageWeakRef, int] = {}
        self.now = 0
        self.peak = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ to keep torch.compile out of it, which
        # imports torch._dynamo on the first operation: most of a second of every `train`
        # and `plan`. Nothing here runs under torch.compile, so the wrapper is not needed.
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        # Storages freed since the last operation were gone before this one's outputs came.
        for ref in [r for r in self._live if r.expired()]:
            self.now -= self._live.pop(ref)
        # An output on an input's storage (a view, an in-place result) allocated nothing,
        # even when that storage was made before the block.
        inputs = {
            StorageWeakRef(t.untyped_storage())
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                ref = StorageWeakRef(storage)
                if ref not in self._live and ref not in inputs:
                    self._live[ref] = storage.nbytes()
                    self.now += storage.nbytes()
        self.peak = max(self.peak, self.now)
        return out


@dataclass(frozen=True)
class StepBytes:
    """Peak bytes per example of one training step and of one evaluation step."""

    train_per_row: float
    eval_per_row: float

    def train(self, rows: int) -> int:
        return int(self.train_per_row * rows)

    def eval(self, rows: int) -> int:
        return int(self.eval_per_row * rows)


def step_bytes(cfg: RunConfig, rows: int = _PROBE_ROWS) -> StepBytes:
    """Measure ``cfg``'s dense model on a batch of ``rows`` examples (see the module
    docstring); takes tens of milliseconds for the built-in models."""
    schema = cfg.data.schema
    nd, nf = len(schema.dense_names), len(schema.categorical_names)
    with torch.random.fork_rng():  # the caller's random state is left as it was
        torch.manual_seed(0)
        model = cfg.build_model()
        widths = cfg.sparse_widths()
        # one width: [B, F, S]; several: the flat layout the models read then
        shape = (nf, widths[0]) if len(set(widths)) == 1 else (sum(widths),)

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(rows, nd), torch.randn(rows, *shape)

        model.train()
        with PeakLiveBytes() as train:
            dense, sparse = batch()
            sparse.requires_grad_(True)
            logits = model(dense, sparse)
            labels = torch.zeros_like(logits)
            F.binary_cross_entropy_with_logits(logits, labels, reduction="sum").backward()
            del logits, labels, dense, sparse
        model.eval()
        with torch.no_grad(), PeakLiveBytes() as evaluation:
            dense, sparse = batch()
            model(dense, sparse)
    return StepBytes(train.peak / rows, evaluation.peak / rows)

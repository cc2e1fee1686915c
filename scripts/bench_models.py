"""The dense model's training step on one thread, each figure against a baseline in the same run.

    python scripts/bench_models.py [--json] [--quick] [--repeat 9] [--rounds 5]

One step is what a rank runs after its pull: ``model(dense, sparse)``, the BCE-with-logits loss,
``backward`` to the model's weights and to ``sparse`` (the gradient the tables' rows get), and
an Adam step, on one torch thread (a daskhps worker's), with random inputs of 13 dense features
and 26 fields. Figures, each the median over ``--rounds`` rounds of the median of ``--repeat``
steps, the sides interleaved within each round:

1. DLRM's dot interaction as shipped (:func:`daskhps.models.dlrm.dot_interaction`: the Gram
   matrix's gradient in one batched product, ``(G + G^T) X``) against the reference's
   (``torch.bmm(X, X^T)`` under autograd, two batched products in the backward: what the DLRM
   reference implementation and ``scripts/peer_torch.py`` run), at the shapes of
   ``scripts/bench_peers.py`` (dim 16, a rank's half of a 4,096 batch: below
   :data:`~daskhps.models.dlrm.ONE_PRODUCT_FROM_WIDTH`, so the shipped step is autograd's
   too), of dim 32, and of one table of dim 64 (``scripts/bench_tables.py``'s ``one-64``),
   batches of 4,096;
2. DLRM with each field at its own dim (``scripts/bench_tables.py``'s ``per-field`` dims: the
   narrower fields projected to 64 by :class:`~daskhps.models.layers.FieldProjection`) against
   every field at dim 64, a 4,096 batch: what per-field dims cost the dense step.

The 1-minute load average is printed before and after. ``--quick``: batches of 256, 2 steps,
1 round: a smoke run, not figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import Reporter, interleaved
from bench_tables import field_dims

import daskhps.models.dlrm as dlrm
from daskhps.data.synthetic import VOCAB
from daskhps.models.base import InputLayout

NUM_DENSE = 13
PER_FIELD = tuple(field_dims(VOCAB).values())  # bench_tables.py's per-field dims


def reference_interaction(vectors: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """The DLRM reference's interaction: the Gram matrix by ``bmm`` under autograd, whose
    backward is two batched products."""
    b, n, _ = vectors.shape
    gram = torch.bmm(vectors, vectors.transpose(1, 2))
    return gram.reshape(b, n * n).index_select(1, pairs[0] * n + pairs[1])


def _step(
    dims: tuple[int, ...], batch: int, interaction: Callable[..., torch.Tensor]
) -> Callable[[], None]:
    """One training step of a fresh DLRM of these field dims, its interaction ``interaction``."""
    torch.manual_seed(0)
    model = dlrm.DLRM(InputLayout.of_fields(NUM_DENSE, dims))
    opt = torch.optim.Adam(model.parameters())
    dense = torch.randn(batch, NUM_DENSE)
    width = sum(dims) if len(set(dims)) > 1 else None
    shape = (batch, width) if width is not None else (batch, len(dims), dims[0])
    sparse = torch.randn(*shape, requires_grad=True)
    labels = torch.randint(0, 2, (batch,)).float()

    def step() -> None:
        shipped, dlrm.dot_interaction = dlrm.dot_interaction, interaction
        try:
            loss = F.binary_cross_entropy_with_logits(model(dense, sparse), labels)
        finally:
            dlrm.dot_interaction = shipped
        opt.zero_grad()
        sparse.grad = None
        loss.backward()
        opt.step()

    return step


def _compare(
    out: Reporter,
    name: str,
    step: Callable[[], None],
    baseline: Callable[[], None],
    baseline_name: str,
    rounds: int,
    repeat: int,
    **extra: object,
) -> None:
    """Emit ``step``'s milliseconds against ``baseline``'s: the median over the rounds of
    each round's median, the two interleaved within a round."""
    per_round = [
        interleaved({"step": step, "base": baseline}, repeat=repeat) for _ in range(rounds)
    ]
    t = {k: statistics.median(r[k] for r in per_round) for k in ("step", "base")}
    out.emit(
        name, t["step"] * 1e3, "ms", baseline=t["base"] * 1e3, baseline_name=baseline_name, **extra
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Reporter(args.json)
    rounds, repeat = (1, 2) if args.quick else (args.rounds, args.repeat)
    small, large = (256, 256) if args.quick else (2048, 4096)
    print(f"load average (1 min) before: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    shipped = dlrm.dot_interaction
    for dim, batch in ((16, small), (32, large), (64, large)):
        dims = (dim,) * 26
        _compare(
            out,
            f"DLRM step, dim {dim}, batch {batch}, interaction as shipped",
            _step(dims, batch, shipped),
            _step(dims, batch, reference_interaction),
            "the reference's interaction (bmm under autograd)",
            rounds,
            repeat,
        )
    _compare(
        out,
        f"DLRM step, per-field dims, batch {large}",
        _step(PER_FIELD, large, shipped),
        _step((64,) * 26, large, shipped),
        "every field at dim 64",
        rounds,
        repeat,
        dims=list(PER_FIELD),
    )
    print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()

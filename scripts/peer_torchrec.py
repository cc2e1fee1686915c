"""DLRM on Criteo-format TSV logs with TorchRec on the CPU, in one process: the second peer
``scripts/bench_peers.py`` measures daskhps against.

    python scripts/peer_torchrec.py --train DAY_FOLDER --holdout DAY_FOLDER
                                    [--batch 4096] [--dim 16] [--lr 0.05] [--dense-lr 0.001]
                                    [--threads N]

TorchRec is not a dependency of daskhps. On a CPU-only machine with torch 2.13.0+cpu it installs
beside it, without letting pip touch torch, as::

    pip install --no-deps torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0 tensordict==0.15.3 \\
        pyvers==0.2.3 pyre-extensions==0.0.32 typing-inspect

(``import torchrec`` needs tensordict, pyvers and pyre-extensions; numpy, cloudpickle, orjson
and the like come with daskhps's own dependencies). ``torchrec.distributed`` is not used.

The same reading, vocabularies and dense transform as ``scripts/peer_torch.py`` (imported
from it); the model is TorchRec's own ``torchrec.models.dlrm.DLRM``: DenseArch 13-64-16,
InteractionArch (pairwise dot products of the 16-wide dense output and the 26 pooled
embeddings, 351 values), OverArch 367-64-32-1, the same widths and the same 27,601 dense
parameters as daskhps's ``dlrm`` defaults. The 26 tables (dim 16) are one
``FusedEmbeddingBagCollection``: fbgemm's batched CPU kernels, each table's Adagrad (lr 0.05,
``EXACT_ADAGRAD``) applied inside the backward pass, so no sparse gradient is materialised.
Rows start uniform in +-1/sqrt(dim) (daskhps's default) and each table's last row, where a
holdout value unseen in training goes, is zeroed and never trained. Dense layers: Adam, lr
0.001. Each batch's keys go in as a ``KeyedJaggedTensor`` of one value per field and example.

It prints one JSON line with the fields of ``peer_torch.py``'s (``side`` is ``torchrec``).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_torch import CATEGORICAL, peer_args, read_days, report, score_holdout


def main(argv: list[str] | None = None) -> None:
    args, started = peer_args(argv, __doc__.split("\n\n")[0])
    from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    seconds: dict[str, float] = {}
    days = read_days(args, seconds)
    sizes, x_train, y_train = days.sizes, days.x_train, days.y_train
    # Field-major, as a KeyedJaggedTensor lays out its values: [26, rows].
    c_train = torch.from_numpy(np.ascontiguousarray(days.c_train.T))
    c_holdout = torch.from_numpy(np.ascontiguousarray(days.c_holdout.T))
    x_holdout = days.x_holdout

    tables = [
        EmbeddingBagConfig(
            name=f"t_{c}", embedding_dim=args.dim, num_embeddings=n, feature_names=[c]
        )
        for c, n in zip(CATEGORICAL, sizes, strict=True)
    ]
    ebc = FusedEmbeddingBagCollection(
        tables=tables, optimizer_type=torch.optim.Adagrad, optimizer_kwargs={"lr": args.lr}
    )
    bound = 1.0 / math.sqrt(args.dim)
    with torch.no_grad():  # the state dict's tensors are views of fbgemm's weights
        for w in ebc.state_dict().values():
            w.uniform_(-bound, bound)
            w[-1].zero_()  # the unseen row
    model = DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=x_train.shape[1],
        dense_arch_layer_sizes=[64, args.dim],
        over_arch_layer_sizes=[64, 32, 1],
    )
    dense = [p for n, p in model.named_parameters() if "embedding_bag_collection" not in n]
    dense_opt = torch.optim.Adam(dense, lr=args.dense_lr)

    def features(cats: torch.Tensor) -> KeyedJaggedTensor:
        return KeyedJaggedTensor.from_lengths_sync(
            keys=CATEGORICAL,
            values=cats.reshape(-1),
            lengths=torch.ones(cats.numel(), dtype=torch.int32),
        )

    n = len(y_train)
    first_step_at = time.time()
    t = time.perf_counter()
    losses = []
    for a in range(0, n, args.batch):
        b = min(n, a + args.batch)
        logits = model(x_train[a:b], features(c_train[:, a:b])).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logits, y_train[a:b])
        dense_opt.zero_grad()
        loss.backward()  # the tables' Adagrad runs here
        dense_opt.step()
        losses.append(loss.item())
    seconds["train"] = time.perf_counter() - t

    out_logits = score_holdout(
        model,
        lambda a, b: model(x_holdout[a:b], features(c_holdout[:, a:b])).squeeze(1),
        len(days.y_holdout),
        seconds,
    )
    report(
        "torchrec",
        days,
        out_logits,
        started=started,
        first_step_at=first_step_at,
        batch=args.batch,
        losses=losses,
        seconds=seconds,
    )


if __name__ == "__main__":
    main()

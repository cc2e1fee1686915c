"""DLRM on a real click log's train/holdout split in one plain PyTorch process: what a user
would write for a first model, the peer ``scripts/bench_quality.py --real`` compares daskhps's
quality with.

    python scripts/peer_real.py --schema criteo|avazu --train FILE --holdout FILE
                                [--epochs 3] [--batch 256] [--dim 16] [--lr 0.05]
                                [--dense-lr 0.001] [--sparse adagrad|adam] [--seed 0]

Formats: ``criteo`` is the Kaggle/Terabyte TSV (label, I1..I13, C1..C26; no header), ``avazu``
the Kaggle CSV with its header (``click`` the label, ``id`` ignored, every other column
categorical). Each categorical column gets its own vocabulary from the training rows
(``pandas.factorize``, missing a value of its own); a holdout value the training rows never
saw maps to its table's extra row, zero and never updated (``padding_idx``). Criteo's 13
integer columns are ``log1p`` of the value clipped at 0, missing as 0 (daskhps's criteo
schema). The model is DLRM as daskhps's ``model.name: dlrm`` builds it (bottom MLP 13-64-dim
when there are dense columns, pairwise dot products, top MLP 64-32-1), its embeddings started
uniform in +-1/sqrt(dim) and updated by ``torch.optim.Adagrad`` (``--sparse adam``:
``torch.optim.SparseAdam``), the dense layers by ``torch.optim.Adam``; batches in file order,
torch's default threads. After each epoch it scores the holdout; it prints one JSON line with
every epoch's ``auc``, ``logloss`` and ``ne``, and the best epoch by AUC (what a user watching
the holdout keeps).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

CRITEO_DENSE = [f"I{i}" for i in range(1, 14)]
CRITEO_CATEGORICAL = [f"C{i}" for i in range(1, 27)]


def read(schema: str, path: Path) -> tuple[np.ndarray, np.ndarray | None, pd.DataFrame]:
    """Labels, dense features (None without any) and the categorical columns of ``path``."""
    if schema == "criteo":
        names = ["label", *CRITEO_DENSE, *CRITEO_CATEGORICAL]
        df = pd.read_csv(path, sep="\t", header=None, names=names, dtype=str)
        dense = df[CRITEO_DENSE].apply(pd.to_numeric).to_numpy(np.float32, na_value=np.nan)
        dense = np.nan_to_num(np.log1p(np.clip(dense, 0.0, None)), nan=0.0)
        return df["label"].astype(np.float32).to_numpy(), dense, df[CRITEO_CATEGORICAL]
    df = pd.read_csv(path, dtype=str)
    cats = [c for c in df.columns if c not in ("id", "click")]
    return df["click"].astype(np.float32).to_numpy(), None, df[cats]


def index(train: pd.DataFrame, holdout: pd.DataFrame) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Row numbers per column for both splits and each table's size (unseen: the last row)."""
    sizes, tr, ho = [], [], []
    for c in train.columns:
        codes, uniques = pd.factorize(train[c], use_na_sentinel=False)
        seen = uniques.get_indexer(holdout[c])
        tr.append(codes)
        ho.append(np.where(seen < 0, len(uniques), seen))
        sizes.append(len(uniques) + 1)
    return sizes, np.stack(tr, 1).astype(np.int64), np.stack(ho, 1).astype(np.int64)


class DLRM(nn.Module):
    def __init__(self, sizes: list[int], num_dense: int, dim: int) -> None:
        super().__init__()
        self.tables = nn.ModuleList(
            nn.Embedding(n, dim, sparse=True, padding_idx=n - 1) for n in sizes
        )
        with torch.no_grad():
            for t in self.tables:
                nn.init.uniform_(t.weight, -1 / math.sqrt(dim), 1 / math.sqrt(dim))
                t.weight[-1].zero_()
        self.bottom = (
            nn.Sequential(nn.Linear(num_dense, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
            if num_dense
            else None
        )
        n = len(sizes) + (1 if num_dense else 0)
        self.register_buffer("pairs", torch.triu_indices(n, n, offset=1), persistent=False)
        top_in = n * (n - 1) // 2 + (dim if num_dense else 0)
        self.top = nn.Sequential(
            nn.Linear(top_in, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1)
        )

    def forward(self, dense: torch.Tensor | None, cats: torch.Tensor) -> torch.Tensor:
        vectors = [t(cats[:, j]) for j, t in enumerate(self.tables)]
        head = []
        if self.bottom is not None:
            assert dense is not None
            x = self.bottom(dense)
            vectors.insert(0, x)
            head = [x]
        stacked = torch.stack(vectors, dim=1)
        gram = torch.bmm(stacked, stacked.transpose(1, 2))
        inter = gram[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([*head, inter], dim=1)).squeeze(1)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve from average ranks (tied scores share their rank)."""
    ranks = pd.Series(scores).rank(method="average").to_numpy()
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def scores(labels: np.ndarray, p: np.ndarray) -> dict[str, float]:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    loss = float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))
    ctr = float(labels.mean())
    base = -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr))
    return {"auc": auc(labels, p), "logloss": loss, "ne": loss / base}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schema", choices=["criteo", "avazu"], required=True)
    ap.add_argument("--train", type=Path, required=True)
    ap.add_argument("--holdout", type=Path, required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05, help="the embeddings' learning rate")
    ap.add_argument("--dense-lr", type=float, default=1e-3)
    ap.add_argument("--sparse", choices=["adagrad", "adam"], default="adagrad")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    y, dense, cats = read(args.schema, args.train)
    hy, hdense, hcats = read(args.schema, args.holdout)
    sizes, idx, hidx = index(cats, hcats)
    model = DLRM(sizes, 0 if dense is None else dense.shape[1], args.dim)
    sparse_params = list(model.tables.parameters())
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
    if args.sparse == "adagrad":
        sparse_opt: torch.optim.Optimizer = torch.optim.Adagrad(sparse_params, lr=args.lr)
    else:
        sparse_opt = torch.optim.SparseAdam(sparse_params, lr=args.lr)
    dense_opt = torch.optim.Adam(dense_params, lr=args.dense_lr)
    X = torch.from_numpy(idx)
    D = torch.from_numpy(dense) if dense is not None else None
    Y = torch.from_numpy(y)
    HX = torch.from_numpy(hidx)
    HD = torch.from_numpy(hdense) if hdense is not None else None
    epochs = []
    for _ in range(args.epochs):
        model.train()
        for s in range(0, len(Y), args.batch):
            sl = slice(s, s + args.batch)
            logit = model(D[sl] if D is not None else None, X[sl])
            loss = F.binary_cross_entropy_with_logits(logit, Y[sl])
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            loss.backward()
            sparse_opt.step()
            dense_opt.step()
        model.eval()
        with torch.no_grad():
            p = torch.sigmoid(model(HD, HX)).numpy()
        epochs.append(scores(hy, p))
    best = max(range(len(epochs)), key=lambda e: epochs[e]["auc"])
    print(
        json.dumps(
            {
                "schema": args.schema,
                "train_rows": len(Y),
                "holdout_rows": len(hy),
                "epochs": epochs,
                "best_epoch": best + 1,
                **epochs[best],
                "seconds": time.perf_counter() - t0,
                "options": {k: str(v) for k, v in vars(args).items()},
            }
        )
    )


if __name__ == "__main__":
    main()

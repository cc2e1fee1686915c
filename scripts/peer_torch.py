"""DLRM on Criteo-format TSV logs in one plain PyTorch process: what a user would write
instead of ``daskhps train``, the peer that ``scripts/bench_peers.py`` measures daskhps against.

    python scripts/peer_torch.py --train DAY_FOLDER --holdout DAY_FOLDER
                                 [--batch 4096] [--dim 16] [--lr 0.05] [--dense-lr 0.001]
                                 [--threads N]

It reads every ``part-*`` file of each folder with pandas (``engine="pyarrow"``), gives each of
the 26 categorical columns its own vocabulary with ``pandas.factorize`` on the training day (a
missing value is a category of its own, trained like any other: daskhps hashes it to one key
per field), and transforms the 13 dense columns as daskhps's criteo schema does (clipped at 0,
``log1p``, missing as 0). A holdout value the training day never saw maps to an extra row of
its table, the ``padding_idx``: zero at the start and never updated, so it adds nothing to the
interactions. (daskhps gives such a key its initial row, a function of the key; with
``--vocab-scale 0.1`` they are about 1% of the holdout's values.)

The model is DLRM with the widths daskhps's ``model.name: dlrm`` defaults to: bottom MLP
13-64-16 (ReLU after each layer), the 16-wide output and the 26 embeddings interacting by
pairwise dot products (strict upper triangle, 351 values), top MLP 367-64-32-1; 26
``nn.Embedding(sparse=True)`` tables of dim 16 started uniform in +-1/sqrt(dim) (daskhps's
default ``table.init_scale``), updated by ``torch.optim.Adagrad`` (lr 0.05); the dense layers by
``torch.optim.Adam`` (lr 0.001); binary cross-entropy averaged over the batch; batches of 4096
in file order (``passes.shuffle_examples`` is off in daskhps too), one epoch, the last batch
partial. Then the holdout AUC (average ranks, ties shared) and log loss. It trains with torch's
default threads (one per core) unless ``--threads`` says otherwise: on a 2-core machine that
other work also uses, two OpenMP threads can wait on each other's descheduled core and steps
of 512 examples took 20 times longer than on one thread; steps of 4,096 suffer less.

It prints one JSON line: ``wall_s`` (from the process's start, interpreter and imports
included, to the end of evaluation), ``time_to_first_step_s`` (from the process's start to the
start of the first training step: imports, reading and indexing both days, building the
model), ``first_step_at`` (that moment as a Unix time, for a caller's own clock),
``train_s`` and ``examples_per_s`` (the training loop alone, first step to last), the seconds
of each phase, ``auc``, ``logloss`` and the sizes.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import torch
import torch.nn.functional as F
from torch import nn

DENSE = [f"I{i}" for i in range(1, 14)]
CATEGORICAL = [f"C{i}" for i in range(1, 27)]
COLUMNS = ["label", *DENSE, *CATEGORICAL]
DTYPES = {"label": "float32", **dict.fromkeys(DENSE, "float32"), **dict.fromkeys(CATEGORICAL, str)}


def read_day(folder: Path) -> pd.DataFrame:
    files = sorted(folder.glob("part-*"))
    if not files:
        raise SystemExit(f"no part-* files in {folder}")
    frames = [
        pd.read_csv(f, sep="\t", header=None, names=COLUMNS, dtype=DTYPES, engine="pyarrow")
        for f in files
    ]
    return pd.concat(frames, ignore_index=True)


def dense_features(df: pd.DataFrame) -> torch.Tensor:
    """log1p of the values clipped at 0; missing values are 0 (daskhps's criteo schema)."""
    x = df[DENSE].to_numpy(np.float32, na_value=np.nan)
    x = np.log1p(np.clip(x, 0.0, None))
    return torch.from_numpy(np.nan_to_num(x, nan=0.0))


def index_columns(
    train: pd.DataFrame, holdout: pd.DataFrame
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Each categorical column's row numbers, ``int64[rows, 26]`` for both days, and each
    table's size: the training day's distinct values (missing is one) plus the unseen row."""
    sizes: list[int] = []
    train_idx = np.empty((len(train), len(CATEGORICAL)), np.int64)
    holdout_idx = np.empty((len(holdout), len(CATEGORICAL)), np.int64)
    for j, c in enumerate(CATEGORICAL):
        codes, uniques = pd.factorize(train[c], use_na_sentinel=False)
        seen = uniques.get_indexer(holdout[c])
        train_idx[:, j] = codes
        holdout_idx[:, j] = np.where(seen < 0, len(uniques), seen)  # unseen: the zero row
        sizes.append(len(uniques) + 1)
    return sizes, train_idx, holdout_idx


class DLRM(nn.Module):
    pairs: torch.Tensor  # int64[2, 351]: the strict upper triangle of the Gram matrix

    def __init__(self, table_sizes: list[int], num_dense: int = 13, dim: int = 16) -> None:
        super().__init__()
        tables = [nn.Embedding(n, dim, sparse=True, padding_idx=n - 1) for n in table_sizes]
        bound = 1.0 / math.sqrt(dim)
        with torch.no_grad():
            for t in tables:
                nn.init.uniform_(t.weight, -bound, bound)
                t.weight[-1].zero_()  # the unseen row
        self.tables = nn.ModuleList(tables)
        self.bottom = nn.Sequential(
            nn.Linear(num_dense, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU()
        )
        n = len(table_sizes) + 1
        self.register_buffer("pairs", torch.triu_indices(n, n, offset=1), persistent=False)
        self.top = nn.Sequential(
            nn.Linear(dim + n * (n - 1) // 2, 64),
            nn.ReLU(),
            nn.Linear(64, 32),
            nn.ReLU(),
            nn.Linear(32, 1),
        )

    def forward(self, dense: torch.Tensor, cats: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        vectors = torch.stack([x, *(t(cats[:, j]) for j, t in enumerate(self.tables))], dim=1)
        gram = torch.bmm(vectors, vectors.transpose(1, 2))
        inter = gram[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve from average ranks (tied scores share their rank)."""
    ranks = pd.Series(scores).rank(method="average").to_numpy()
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def peer_args(argv: list[str] | None, description: str) -> tuple[argparse.Namespace, float]:
    """The peers' shared options (threads and seed applied) and the process's start time."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--train", type=Path, required=True, help="folder of the training day")
    ap.add_argument("--holdout", type=Path, required=True, help="folder of the holdout day")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05, help="Adagrad's, for the embeddings")
    ap.add_argument("--dense-lr", type=float, default=1e-3, help="Adam's, for the dense layers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = psutil.Process().create_time()
    torch.manual_seed(args.seed)
    return args, started


@dataclass
class Days:
    """Both days read and indexed: dense features, labels, each field's row indices."""

    sizes: list[int]
    x_train: torch.Tensor
    y_train: torch.Tensor
    c_train: np.ndarray
    x_holdout: torch.Tensor
    y_holdout: np.ndarray
    c_holdout: np.ndarray
    unseen: float  # share of the holdout's cells whose value the training day lacks


def read_days(args: argparse.Namespace, seconds: dict[str, float]) -> Days:
    """Read both days (seconds["read"]) and index their fields (seconds["index"])."""
    t = time.perf_counter()
    train, holdout = read_day(args.train), read_day(args.holdout)
    seconds["read"] = time.perf_counter() - t
    t = time.perf_counter()
    sizes, train_idx, holdout_idx = index_columns(train, holdout)
    days = Days(
        sizes=sizes,
        x_train=dense_features(train),
        y_train=torch.from_numpy(train["label"].to_numpy(np.float32, copy=True)),
        c_train=train_idx,
        x_holdout=dense_features(holdout),
        y_holdout=holdout["label"].to_numpy(np.float32),
        c_holdout=holdout_idx,
        unseen=float((holdout_idx == np.asarray(sizes) - 1).mean()),
    )
    seconds["index"] = time.perf_counter() - t
    return days


def score_holdout(
    model: nn.Module,
    score: Callable[[int, int], torch.Tensor],
    n: int,
    seconds: dict[str, float],
    chunk: int = 8192,
) -> np.ndarray:
    """The logits of holdout rows ``[0, n)``, ``score(a, b)`` for each chunk of rows ``[a, b)``,
    with ``model`` in eval mode and no autograd; its seconds go to ``seconds["eval"]``."""
    t = time.perf_counter()
    model.eval()
    with torch.no_grad():
        logits = torch.cat([score(a, min(a + chunk, n)) for a in range(0, n, chunk)]).numpy()
    seconds["eval"] = time.perf_counter() - t
    return logits


def report(
    side: str,
    days: Days,
    logits: np.ndarray,
    *,
    started: float,
    first_step_at: float,
    batch: int,
    losses: list[float],
    seconds: dict[str, float],
) -> None:
    """Print the run's one JSON line: its times, the holdout's AUC and log loss."""
    y = days.y_holdout
    p = np.clip(1.0 / (1.0 + np.exp(-logits.astype(np.float64))), 1e-7, 1 - 1e-7)
    n = len(days.y_train)
    out = {
        "side": side,
        "wall_s": round(time.time() - started, 3),
        "time_to_first_step_s": round(first_step_at - started, 3),
        "first_step_at": first_step_at,
        "train_s": round(seconds["train"], 3),
        "examples": n,
        "examples_per_s": round(n / seconds["train"], 1),
        "batches": math.ceil(n / batch),
        "final_train_loss": round(float(np.mean(losses[-10:])), 5),
        "auc": round(auc(y, logits), 5),
        "logloss": round(float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))), 5),
        "holdout_examples": len(y),
        "holdout_unseen_share": round(days.unseen, 5),
        "table_rows": sum(days.sizes),
        "torch_threads": torch.get_num_threads(),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
    }
    print(json.dumps(out), flush=True)


def main(argv: list[str] | None = None) -> None:
    args, started = peer_args(argv, __doc__.split("\n\n")[0])
    seconds: dict[str, float] = {}
    days = read_days(args, seconds)
    sizes = days.sizes
    x_train, y_train, c_train = days.x_train, days.y_train, torch.from_numpy(days.c_train)
    x_holdout, c_holdout = days.x_holdout, torch.from_numpy(days.c_holdout)

    model = DLRM(sizes, dim=args.dim)
    sparse = [p for n, p in model.named_parameters() if n.startswith("tables.")]
    dense = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
    sparse_opt = torch.optim.Adagrad(sparse, lr=args.lr)
    dense_opt = torch.optim.Adam(dense, lr=args.dense_lr)

    n = len(y_train)
    first_step_at = time.time()
    t = time.perf_counter()
    losses = []
    for a in range(0, n, args.batch):
        b = min(n, a + args.batch)
        loss = F.binary_cross_entropy_with_logits(model(x_train[a:b], c_train[a:b]), y_train[a:b])
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        losses.append(loss.item())
    seconds["train"] = time.perf_counter() - t

    logits = score_holdout(
        model, lambda a, b: model(x_holdout[a:b], c_holdout[a:b]), len(days.y_holdout), seconds
    )
    report(
        "torch",
        days,
        logits,
        started=started,
        first_step_at=first_step_at,
        batch=args.batch,
        losses=losses,
        seconds=seconds,
    )


if __name__ == "__main__":
    main()

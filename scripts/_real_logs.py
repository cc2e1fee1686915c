"""Real click logs for ``scripts/bench_quality.py --real``: the split both sides train on,
daskhps's one default config per schema, and the plain-PyTorch peers (``peer_real.py``).

Samples of public logs sit in public repositories; their terms forbid passing them on, so
none is committed here. :data:`SOURCES` names where each sample lies; :func:`fetch` downloads
it (a machine with network), or give the files.

The split is in time order: the first 80% of the rows train, the last 20% are the holdout
(both logs are in time order), written as two day folders so that daskhps's
``data.holdout.day: last`` and the peers read the same rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from daskhps.config import RunConfig
from daskhps.config.overrides import apply_overrides

__all__ = ["EPOCHS", "SOURCES", "daskhps_config", "fetch", "peers", "split"]

EPOCHS = 3
TRAIN_FRACTION = 0.8
BATCH = 256  # a first model on 8,000 rows: a batch a user would pick, both sides
_RAW = "https://raw.githubusercontent.com/Lapis-Hong/Wide-ResDNN"
SOURCES: dict[str, dict[str, Any]] = {
    # The first 10,000 rows of Criteo's Kaggle display-advertising train.txt, in time order.
    "criteo": {
        "urls": [f"{_RAW}/bec3c121c190f42c64823b07b07c0b7eae3e59ca/data/sample.train"],
        "header": False,
        "ext": "tsv",
        "schema": str(Path(__file__).resolve().parents[1] / "configs/schemas/criteo.yaml"),
    },
    # The first 9,999 rows of Avazu's Kaggle train.csv (hour 14102100), in time order: the
    # repository's train (header + 8,999 rows) then test (1,000 labelled rows) files.
    "avazu": {
        "urls": [
            f"{_RAW}/bd35aa733b683b8842daae297d1073e5d46f0eb3/data/avazu/train",
            f"{_RAW}/bd35aa733b683b8842daae297d1073e5d46f0eb3/data/avazu/test",
        ],
        "header": True,
        "ext": "csv",
        "schema": str(Path(__file__).resolve().parents[1] / "configs/schemas/avazu.yaml"),
    },
}


def fetch(name: str, out: Path) -> Path:
    """Download the sample ``name`` of :data:`SOURCES` into ``out`` (one file)."""
    src = SOURCES[name]
    text = ""
    for i, url in enumerate(src["urls"]):
        with urllib.request.urlopen(url, timeout=60) as r:
            part = r.read().decode()
        if i and src["header"]:
            part = part.split("\n", 1)[1]  # a later file's header line
        text += part if part.endswith("\n") else part + "\n"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.{src['ext']}"
    path.write_text(text)
    return path


def split(name: str, sample: Path, out: Path) -> tuple[Path, Path, int, int]:
    """The sample's rows in time order cut into ``out/day=2024-01-01`` (training) and
    ``out/day=2024-01-02`` (holdout); the two files and their row counts."""
    src = SOURCES[name]
    lines = sample.read_text().splitlines(keepends=True)
    head, rows = (lines[:1], lines[1:]) if src["header"] else ([], lines)
    cut = int(len(rows) * TRAIN_FRACTION)
    files = []
    for day, part in (("2024-01-01", rows[:cut]), ("2024-01-02", rows[cut:])):
        folder = out / f"day={day}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"part-00000.{src['ext']}"
        path.write_text("".join(head + part))
        files.append(path)
    return files[0], files[1], cut, len(rows) - cut


def daskhps_config(
    name: str, logs: Path, run_dir: Path, seed: int, rows: int, overrides: tuple[str, ...] = ()
) -> RunConfig:
    """daskhps's defaults on the split: only what says where the rows are, how the run is
    cut (``EPOCHS`` epochs of one pass, batches of ``BATCH`` in file order, like the peers),
    and the embedded cluster's size. No option is tuned per log; ``overrides``
    (``table.optimizer.lr=0.05``) try other defaults."""
    d, _ = apply_overrides(
        {
            "run": {"name": f"real-{name}", "dir": str(run_dir), "seed": seed, "quiet": True},
            "data": {
                "train": {"paths": [str(logs)]},
                "schema": SOURCES[name]["schema"],
                "holdout": {"day": "last"},
            },
            "passes": {
                "epochs": EPOCHS,
                "examples_per_pass": rows,
                "global_batch_size": BATCH,
                "shuffle_examples": False,
            },
            "table": {"tiers": {"store_dir": str(run_dir.parent / f"{run_dir.name}-stores")}},
            "model": {"name": "dlrm"},
            "cluster": {
                "n_workers": 2,
                "threads_per_worker": 1,
                "memory_limit": "2GiB",
                "gpu": False,
                "dashboard_address": None,
            },
        },
        overrides,
    )
    return RunConfig.from_dict(d, source=f"bench_quality --real {name}")


# The peers: what a user writes first. Adagrad at 0.05 for the embeddings is the plain
# PyTorch DLRM of scripts/peer_torch.py; Adam everywhere at torch's default lr the other
# common first script.
PEERS = {
    "adagrad": ["--sparse", "adagrad", "--lr", "0.05"],
    "adam": ["--sparse", "adam", "--lr", "0.001"],
}


def peers(name: str, train: Path, holdout: Path, seed: int) -> dict[str, dict[str, Any]]:
    """Each peer's result on the split (its best epoch by holdout AUC, and every epoch)."""
    script = Path(__file__).resolve().parent / "peer_real.py"
    out = {}
    for peer, options in PEERS.items():
        done = subprocess.run(
            [sys.executable, "-W", "ignore", str(script), "--schema", name, "--train",
             str(train), "--holdout", str(holdout), "--epochs", str(EPOCHS), "--batch",
             str(BATCH), "--seed", str(seed), *options],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        out[peer] = json.loads(done.stdout.strip().splitlines()[-1])
    return out

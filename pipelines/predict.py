"""The batch-scoring job: a model version and click logs in, parquet predictions out.

``daskhps predict --model VERSION_OR_PATH [--checkpoint NAME] --data GLOB --out DIR`` calls
:func:`run`; Python code may call it, or :func:`daskhps.serve.predict.predict`, directly. The
model is a checkpoint folder or a run directory (its latest complete checkpoint, or the one
``--checkpoint`` names).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from daskhps._text import counted
from daskhps.serve import load_servable
from daskhps.serve.predict import PredictResult, predict
from daskhps.serve.score import CacheSizes

__all__ = ["run"]

log = logging.getLogger("daskhps.pipelines.predict")


def run(
    model: str | Path,
    data: str | list[str],
    out: str | Path,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    device_rows: int = 1 << 20,
    host_bytes: int = 256 << 20,
    batch_size: int = 4096,
    overwrite: bool = False,
    labels: str = "auto",
    as_json: bool = False,
    checkpoint: str | None = None,
) -> int:
    """Score ``data`` with ``model`` (with a run directory: its checkpoint named
    ``checkpoint``, default the latest) into ``out``; returns the process exit code."""
    logging.getLogger("distributed").setLevel(logging.ERROR)
    servable = load_servable(model, checkpoint)
    result: PredictResult = predict(
        servable,
        data,
        out,
        address=scheduler,
        n_workers=workers,
        sizes=CacheSizes(device_rows=device_rows, host_bytes=host_bytes),
        batch_size=batch_size,
        overwrite=overwrite,
        labels=labels,
        echo=None if as_json else print,
    )
    if as_json:
        print(json.dumps({"out": str(result.out), **result.to_dict()}, indent=2))
        return 0
    skipped = sum(result.skipped.values())
    unlabelled = len(result.unlabelled)
    print(
        f"scored {counted(result.rows, 'row')} of {counted(len(result.files), 'file')}"
        + (f" ({unlabelled} without a label column)" if unlabelled else "")
        + f" with {result.model} (commit {result.commit}"
        + (f"; {result.chosen}" if result.chosen else "")
        + f") in {result.seconds:.1f} s"
        + (f"; skipped (bad input): {_counts(result.skipped)}" if skipped else "")
    )
    print(f"predictions: {result.out}/part-*.parquet (file, row, probability)")
    return 0


def _counts(by_reason: dict[str, int]) -> str:
    return ", ".join(f"{reason}={n:,}" for reason, n in by_reason.items())

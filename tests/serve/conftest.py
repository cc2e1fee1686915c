"""The serving tests' trained model: a real small training run (LocalCluster, gloo, zarr) on
the session's warm shared clusters, with two checkpoints, its holdout and reference scores.

The reference is computed without the serving code: the dense model from the checkpoint and
each row looked up with ``EmbeddingTable.peek`` in its rank store, in one batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from daskhps.config import RunConfig
from daskhps.data.readers import read_click_log
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.serve import Servable, load_servable
from daskhps.training.trainer import Trainer
from tests._clusters import SharedClusters
from tests._runs import tiny_config
from tests.serve.helpers import reference_rows


def _config(tmp: Path, logs: Path, cluster: dict[str, Any]) -> RunConfig:
    d = tiny_config(
        tmp / "run",
        logs,
        run={"name": "serve"},
        data={"holdout": {"day": "last"}},
        passes={"examples_per_pass": 1000},
        cluster_section=cluster,
    )
    return RunConfig.from_dict(d, source="test")


@pytest.fixture(scope="session")
def run(
    tmp_path_factory: pytest.TempPathFactory, shared_clusters: SharedClusters
) -> dict[str, Any]:
    """A 2-worker training run with a checkpoint, its holdout files and reference rows."""
    tmp = tmp_path_factory.mktemp("serve-run")
    logs = tmp / "logs"
    generate(
        GeneratorConfig(days=2, rows_per_day=2000, parts_per_day=2, seed=4, vocab_scale=0.01),
        str(logs),
    )
    cfg = _config(tmp, logs, shared_clusters.section(workers=2, threads=1))
    result = Trainer(cfg, progress=False).run()  # checkpoints after each of its 2 passes
    servable = load_servable(cfg.run.dir)
    holdout = sorted(str(p) for p in logs.glob("day=*02/part-*"))
    frame = read_click_log(holdout, schema=cfg.data.schema).frame.compute()
    return {
        "cfg": cfg,
        "result": result,
        "servable": servable,
        "holdout": holdout,
        "frame": frame.reset_index(drop=True),
        "reference": _reference(servable, frame),
        "tmp": tmp,
    }


def _reference(s: Servable, frame: pd.DataFrame) -> np.ndarray:
    schema = s.config.data.schema
    keys = torch.from_numpy(frame[list(schema.categorical_names)].to_numpy(np.int64).copy())
    rows = reference_rows(s.table, keys.reshape(-1))[:, : s.table.spec.dim]
    dense = torch.from_numpy(frame[list(schema.dense_names)].to_numpy(np.float32).copy())
    with torch.no_grad():
        logits = s.build_model()(dense, rows.view(len(frame), keys.shape[1], -1))
    return torch.sigmoid(logits).numpy()

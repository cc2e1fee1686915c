"""The quickstart trained from a bucket on the embedded cluster, its copy written to a bucket:
an S3-compatible server on 127.0.0.1 (tests/_s3.py), reached by the driver and the workers
through ``storage.options`` alone. The run equals the same run from local files bit for bit,
its copy is in the bucket and loads, and ``config.yaml`` holds no credential."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from daskhps.config import RunConfig
from daskhps.training.checkpoint import latest_checkpoint
from daskhps.training.trainer import Trainer
from tests._logs import generated_logs
from tests._runs import tiny_config
from tests._s3 import KEY, SECRET, s3_server

pytestmark = pytest.mark.slow


def _rows(run: Path) -> tuple[np.ndarray, np.ndarray]:
    ckpt = latest_checkpoint(run)
    assert ckpt is not None
    with ckpt.open_store(0) as store:
        keys = np.sort(store.keys())
        return keys, store.lookup(keys).rows.numpy()


def test_a_run_from_a_bucket_equals_the_run_from_local_files(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    logs = generated_logs(
        tmp_path_factory, days=2, rows_per_day=1500, parts_per_day=2, seed=7, name="bucket"
    )
    assert not any(k.startswith("AWS_") and k != "AWS_CA_BUNDLE" for k in os.environ)
    with s3_server() as server:
        url = server.upload(logs, server.bucket("clicks") + "/logs")
        server.bucket("copies")
        results = {}
        for name, paths in (("local", str(logs)), ("bucket", url)):
            d = tiny_config(
                tmp_path / name,
                logs,
                data={"train": {"paths": [paths]}, "holdout": {"day": "last"}},
                passes={"examples_per_pass": 600},
                checkpoint={"replicate_to": f"s3://copies/{name}"},
                storage={"options": server.options},
            )
            results[name] = Trainer(RunConfig.from_dict(d, source="test"), progress=False).run()
        copied = sorted(server.fs().find("copies/bucket/checkpoints"))
    local, bucket = results["local"], results["bucket"]
    assert bucket.pass_losses == local.pass_losses and len(local.passes) >= 3
    assert bucket.final_eval == local.final_eval and bucket.final_eval["auc"] > 0.5
    for k, v in local.dense_state.items():
        assert torch.equal(bucket.dense_state[k], v), k
    keys, rows = _rows(tmp_path / "local")
    keys_b, rows_b = _rows(tmp_path / "bucket")
    assert np.array_equal(keys, keys_b) and np.array_equal(rows, rows_b)
    last = latest_checkpoint(tmp_path / "bucket")
    assert last is not None
    assert f"copies/bucket/checkpoints/{last.name}/MANIFEST.json" in copied
    saved = (tmp_path / "bucket" / "config.yaml").read_text()
    assert "s3://clicks/logs" in saved and SECRET not in saved and KEY not in saved
    assert "storage" not in saved

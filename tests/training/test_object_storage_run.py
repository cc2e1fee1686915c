"""The quickstart trained from a bucket on the embedded cluster, its copy written to a bucket:
an S3-compatible server on 127.0.0.1 (tests/_s3.py), reached by the driver and the workers
through ``storage.options`` alone. The run equals the same run from local files bit for bit,
its copy is in the bucket and loads, and ``config.yaml`` holds no credential."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from daskhps.config import RunConfig
from daskhps.runfiles.checkpoint import latest_checkpoint
from daskhps.training.trainer import Trainer
from tests._logs import generated_logs
from tests._runs import cli_here, tiny_config, write_config
from tests._s3 import KEY, SECRET, S3Server, s3_server
from tests.serve.helpers import tree_state

pytestmark = pytest.mark.slow


def _rows(run: Path) -> tuple[np.ndarray, np.ndarray]:
    ckpt = latest_checkpoint(run)
    assert ckpt is not None
    with ckpt.open_store(0) as store:
        keys = np.sort(store.keys())
        return keys, store.lookup(keys).rows.numpy()


def _wrong_inputs_change_nothing(
    tmp_path: Path,
    config: dict,
    server: S3Server,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The bucket run and a copy of its folder, given a bucket that does not exist and an
    endpoint that refuses connections, with --overwrite and --resume: one line each, exit 1,
    and not a file of either folder, nor an object of the copy, changed."""
    shutil.copytree(tmp_path / "bucket", tmp_path / "bucket-copy")
    before = {**tree_state(tmp_path / "bucket"), **tree_state(tmp_path / "bucket-copy")}
    objects = server.fs().find("copies", detail=True)
    wrong = {
        "no such bucket": ("data.train.paths=[s3://no-such-bucket/logs]", "the bucket 'no-such"),
        "refused": ("storage.options.s3.endpoint_url=http://127.0.0.1:9", "cannot connect to"),
    }
    # Each wrong input with each flag, on the run or on its copy (every case once).
    cases = [
        ("bucket", "--overwrite", "no such bucket"),
        ("bucket", "--resume", "refused"),
        ("bucket-copy", "--overwrite", "refused"),
        ("bucket-copy", "--resume", "no such bucket"),
    ]
    for run, flag, case in cases:
        cfg = write_config(
            tmp_path / f"{run}.yaml",
            {**config, "run": {**config["run"], "dir": str(tmp_path / run)}},
        )
        override, said = wrong[case]
        if (flag, case) == ("--resume", "no such bucket"):
            said = "the config changed where a resume must not (data.train.paths"
        got = cli_here(capfd, caplog, "train", str(cfg), flag, "--set", override)
        assert got.returncode == 1, got.stderr
        lines = [x for x in got.stderr.splitlines() if "error" in x]
        assert len(lines) == 1 and said in lines[0], got.stderr
        assert SECRET not in got.stderr and KEY not in got.stderr
    after = {**tree_state(tmp_path / "bucket"), **tree_state(tmp_path / "bucket-copy")}
    assert after == before
    assert server.fs().find("copies", detail=True) == objects


def test_a_run_from_a_bucket_equals_the_run_from_local_files(
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
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
        _wrong_inputs_change_nothing(tmp_path, d, server, capfd, caplog)
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

"""Online serving end to end: train and publish v1 with ``daskhps retrain``, serve it with a
real ``daskhps serve`` process, publish v2 with ``retrain``; the server moves to v2 by itself
(its poll of ``CURRENT``), and every answer equals ``daskhps predict`` on the same rows and
version within 1e-6. Real day partitions, a real LocalCluster, real zarr stores, loopback HTTP.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from daskhps.cli import main
from daskhps.data.source import SUCCESS
from daskhps.retrain import ExitCode, Registry
from daskhps.serve.client import ServeClient
from tests._clusters import SharedClusters
from tests._logs import generated_logs
from tests._runs import tiny_config
from tests._signals import default_dispositions

pytestmark = pytest.mark.slow

DAYS = ["2024-01-01", "2024-01-02", "2024-01-03"]


def _arrive(all_days: Path, logs: Path, day: str) -> None:
    shutil.copytree(all_days / f"day={day}", logs / f"day={day}")
    (logs / f"day={day}" / SUCCESS).write_text("")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _predict(model: str, data: str, out: Path, scheduler: str) -> np.ndarray:
    assert main(["predict", "--model", model, "--data", data, "--out", str(out),
                 "--scheduler", scheduler]) == 0  # fmt: skip
    parts = sorted(out.glob("part-*.parquet"))
    return pd.concat([pd.read_parquet(p) for p in parts])["probability"].to_numpy()


def test_serve_follows_retrain_and_answers_as_predict(
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    shared_clusters: SharedClusters,
    capsys: pytest.CaptureFixture[str],
) -> None:
    all_days = generated_logs(
        tmp_path_factory, days=3, rows_per_day=2000, parts_per_day=1, seed=8, name="serve-days"
    )
    logs = tmp_path / "logs"
    section = shared_clusters.section(workers=1, threads=2)
    config = tiny_config(
        tmp_path / "run",
        logs,
        run={"name": "srv", "seed": 2},
        data={"train": {"require_complete": True}},
        passes={"examples_per_pass": 2000, "global_batch_size": 200},
        table={"tiers": {"device": {"rows": 50_000}}},
        cluster_section=section,
        eval={"every_pass": False},
        retrain={"max_auc_drop": 0.2, "max_logloss_rise": 0.2},  # tiny days: noisy AUCs
    )
    cfg = tmp_path / "retrain.yaml"
    cfg.write_text(yaml.safe_dump(config))
    registry = Registry(tmp_path / "run" / "versions")
    for day in DAYS[:2]:
        _arrive(all_days, logs, day)
    assert main(["retrain", str(cfg)]) == ExitCode.PUBLISHED
    capsys.readouterr()

    rows_file = str(next((all_days / f"day={DAYS[2]}").glob("part-*")))
    text = Path(rows_file).read_text()
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "daskhps.cli", "serve", "--model", str(tmp_path / "run"),
         "--port", str(port), "--poll-s", "0.5", "--device-rows", "5000", "--host-mb", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_dispositions,  # stopped by SIGTERM below, whatever the suite inherited
    )  # fmt: skip
    try:
        client = ServeClient(f"http://127.0.0.1:{port}")
        client.wait_ready(120)
        first = client.predict_lines(text)
        assert first.version == "v000001"

        _arrive(all_days, logs, DAYS[2])
        assert main(["retrain", str(cfg)]) == ExitCode.PUBLISHED
        capsys.readouterr()
        current = registry.current()
        assert current is not None and current.name == "v000002"
        deadline, answer = time.monotonic() + 60, first
        while answer.version != "v000002" and time.monotonic() < deadline:
            answer = client.predict_lines(text)  # never fails while it moves
            time.sleep(0.1)
        assert answer.version == "v000002"
        metrics = client.metrics()
        client.close()
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    assert server.returncode == 0, err
    assert 'daskhps_serve_refreshes_total{how="diff"} 1.0' in metrics, metrics
    scheduler = section["address"]
    v1 = _predict(str(registry.get("v000001").checkpoint), rows_file, tmp_path / "p1", scheduler)
    v2 = _predict(str(tmp_path / "run"), rows_file, tmp_path / "p2", scheduler)
    assert len(first.probabilities) == len(v1) == len(v2) > 1000
    assert np.abs(np.array(first.probabilities) - v1).max() < 1e-6
    assert np.abs(np.array(answer.probabilities) - v2).max() < 1e-6
    assert np.abs(v1 - v2).max() > 1e-4  # v2 is another model
    assert json.loads((tmp_path / "p2" / "_predict.json").read_text())["rows"] == len(v2)

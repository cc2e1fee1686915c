"""End-to-end training on a real LocalCluster with a real gloo group (warm clusters shared by
the runs, tests/_clusters.py).

* transparency (invariant 1): one worker whose host tier holds nothing and whose device tier
  just fits a pass ends bit-identical to one whose tiers hold everything, whether the next
  pass is staged ahead or not;
* worker count (invariant 3): 1 and 2 workers on the same global batches end within 1e-5
  with SGD, within 1e-3 after 50 steps with Adagrad;
* bad input ends in one clear line and a non-zero exit code.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from daskhps.config import RunConfig
from daskhps.data.readers import read_click_log
from daskhps.table import EmbeddingTable
from daskhps.training.trainer import RunResult, Trainer
from tests._clusters import SharedClusters
from tests._logs import generated_logs
from tests._runs import cli_here, set_keys, tiny_config

PASS = 1000


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logs(tmp_path_factory, days=2, rows_per_day=3000, parts_per_day=2, seed=3)


def _config(tmp: Path, logs: Path, cluster: dict[str, Any], **over: Any) -> RunConfig:
    d = tiny_config(
        tmp / "run",
        logs,
        run={"name": "e2e"},
        data={"holdout": {"day": "last"}},
        passes={"examples_per_pass": PASS},
        table={"optimizer": {"kind": "sgd", "lr": 0.05}},
        dense_optimizer={"kind": "sgd", "lr": 0.05},
        cluster_section=cluster,
    )
    set_keys(d, over)
    return RunConfig.from_dict(d, source="test")


def _rows(cfg: RunConfig, workers: int) -> dict[int, np.ndarray]:
    """Every committed row of every shard, by key."""
    spec = cfg.table_spec()
    out: dict[int, np.ndarray] = {}
    for r in range(workers):
        path = Path(cfg.table.tiers.store_dir) / spec.name / f"rank-{r}"
        with EmbeddingTable.open(spec, path, device_rows=16, mode="r") as t:
            keys = t.store.keys()
            rows = t.peek(keys).numpy()
            out.update(zip(keys.tolist(), rows, strict=True))
    return out


SMALL_PASS = PASS // 2  # passes of half the usual size: the table is 3x what the tiers hold


def _working_sets(logs: Path, rows: int) -> tuple[int, int]:
    """The largest pass's distinct keys (passes of ``rows`` rows) and the day's."""
    frame = read_click_log(sorted(str(p) for p in logs.glob("day=*01/*.tsv"))).frame.compute()
    cats = frame[[c for c in frame.columns if c.startswith("C")]].to_numpy()
    largest = max(len(np.unique(cats[a : a + rows])) for a in range(0, len(cats), rows))
    return largest, len(np.unique(cats))


def _run(cfg: RunConfig) -> RunResult:
    return Trainer(cfg, progress=False).run()


@pytest.fixture(scope="module")
def roomy(
    tmp_path_factory: pytest.TempPathFactory, logs: Path, shared_clusters: SharedClusters
) -> tuple[RunResult, dict[int, np.ndarray]]:
    """Tiers that hold everything, pass k+1 staged while pass k trains (2 threads): the run
    both tiny-tier runs below must match, bit for bit (read only)."""
    cfg = _config(
        tmp_path_factory.mktemp("roomy"),
        logs,
        shared_clusters.section(workers=1, threads=2),
        **{
            "table.optimizer": {"kind": "adagrad", "lr": 0.05},
            "passes.examples_per_pass": SMALL_PASS,
        },
    )
    return _run(cfg), _rows(cfg, 1)


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2], ids=["sequential", "pipelined"])
def test_tiny_tiers_train_bit_identical_to_roomy_tiers(
    tmp_path: Path,
    logs: Path,
    shared_clusters: SharedClusters,
    roomy: tuple[RunResult, dict[int, np.ndarray]],
    threads: int,
) -> None:
    """With 2 threads per worker pass k+1 is staged while pass k trains (or, where both
    working sets do not fit, right after); with 1, after it. The model must not notice: the
    tiny-tier run, either way, ends bit-identical to the roomy run staged ahead, with a
    table more than 3x what its tiers hold."""
    just_fits, table_keys = _working_sets(logs, SMALL_PASS)
    assert table_keys >= 3 * just_fits  # the tiers' whole budget: device rows, no host
    tiny_cfg = _config(
        tmp_path / "tiny",
        logs,
        shared_clusters.section(workers=1, threads=threads),
        **{
            "table.optimizer": {"kind": "adagrad", "lr": 0.05},
            "table.tiers": {"device": {"rows": just_fits}, "host": {"fraction": 0.0}},
            "passes.examples_per_pass": SMALL_PASS,
        },
    )
    tiny = _run(tiny_cfg)
    roomy_run, rows_roomy = roomy
    assert len(tiny.passes) == len(roomy_run.passes) == 6
    for a, b in zip(tiny.passes, roomy_run.passes, strict=True):
        assert a["batch_losses"] == b["batch_losses"]
        assert a["eval"] == b["eval"]
    # the tiny run really went down to the zarr store and back; the roomy one never did
    assert sum(p["staged_from"]["store"] for p in tiny.passes) > 0
    assert sum(p["staged_from"]["store"] for p in roomy_run.passes) == 0
    for k, v in tiny.dense_state.items():
        assert torch.equal(v, roomy_run.dense_state[k]), k
    rows_tiny = _rows(tiny_cfg, 1)
    assert rows_tiny.keys() == rows_roomy.keys()
    assert len(rows_tiny) >= 3 * just_fits  # a table 3x the tiers, bit-identical
    for k, v in rows_tiny.items():
        assert np.array_equal(v.view(np.int32), rows_roomy[k].view(np.int32)), k


def test_rows_count_their_keys_and_keep_their_last_day(
    tmp_path: Path, logs: Path, shared_clusters: SharedClusters
) -> None:
    """Every committed row's statistics are its key's occurrences in the examples trained
    on and the last log day it occurred on, on two workers whatever the passes' bounds."""
    cfg = _config(
        tmp_path, logs, shared_clusters.section(workers=2, threads=2), **{"data.holdout": None}
    )
    _run(cfg)
    frame = read_click_log(str(logs)).frame.compute()
    cats = frame[[c for c in frame.columns if c.startswith("C")]].to_numpy()
    days = [p.name.removeprefix("day=") for p in sorted(logs.glob("day=*"))]
    day = np.repeat([date.fromisoformat(d).toordinal() for d in days], 3000)
    cells = pd.DataFrame({"key": cats.ravel(), "day": np.repeat(day, cats.shape[1])})
    want = cells.groupby("key")["day"].agg(["size", "max"])
    rows = _rows(cfg, 2)
    assert sorted(rows) == want.index.tolist()
    spec = cfg.table_spec()
    got = np.stack([rows[k] for k in want.index])
    stats = np.ascontiguousarray(got[:, spec.stats_at :]).view(np.int32)
    assert stats[:, 0].tolist() == want["size"].tolist()
    assert stats[:, 1].tolist() == want["max"].tolist()
    assert len(set(stats[:, 1].tolist())) == 2  # both days are there


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind,tol,batch",
    [("sgd", 1e-5, 100), ("adagrad", 1e-3, 60)],  # adagrad: 3000 / 60 = 50 steps
)
def test_one_and_two_workers_train_the_same_model(
    tmp_path: Path, logs: Path, shared_clusters: SharedClusters, kind: str, tol: float, batch: int
) -> None:
    over = {
        "table.optimizer": {"kind": kind, "lr": 0.05},
        "dense_optimizer": {"kind": kind, "lr": 0.05},
        "passes.global_batch_size": batch,
        "passes.examples_per_pass": 3000,
    }
    one_cfg = _config(tmp_path / "one", logs, shared_clusters.section(workers=1, threads=1), **over)
    two_cfg = _config(tmp_path / "two", logs, shared_clusters.section(workers=2, threads=1), **over)
    one, two = _run(one_cfg), _run(two_cfg)
    assert sum(len(p["batch_losses"]) for p in one.passes) == 3000 // batch
    dense_one = np.concatenate([v.numpy().ravel() for v in one.dense_state.values()])
    dense_two = np.concatenate([two.dense_state[k].numpy().ravel() for k in one.dense_state])
    assert _rel(dense_two, dense_one) < tol
    rows_one, rows_two = _rows(one_cfg, 1), _rows(two_cfg, 2)
    assert rows_one.keys() == rows_two.keys()
    keys = sorted(rows_one)
    a = np.stack([rows_one[k] for k in keys])
    b = np.stack([rows_two[k] for k in keys])
    assert _rel(b, a) < tol
    assert abs(one.final_eval["auc"] - two.final_eval["auc"]) < 0.003


def test_bad_data_path_is_one_clear_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "bad.yaml"
    run, missing = tmp_path / "run", tmp_path / "nothing-here"
    cfg.write_text(
        f"run: {{name: bad, dir: {run}}}\n"
        f"data: {{train: {{paths: [{missing}]}}}}\n"
        "cluster: {n_workers: 1, gpu: false, dashboard_address: null}\n"
    )
    res = cli_here(capfd, caplog, "train", str(cfg))  # refused before any cluster starts
    assert res.returncode == 1
    assert "nothing-here" in res.stderr
    assert "Traceback" not in res.stderr

"""The ``network`` record of every pass of a tiny two-worker run (daskhps.monitor.network):
what each rank sent and received by kind, never less than the least the pass needs, counted
afresh each pass; and the readers of metrics.jsonl take the lines that carry it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daskhps.config import RunConfig
from daskhps.distributed.collective import ring_allreduce_bytes
from daskhps.monitor.network import KINDS
from daskhps.monitor.report import load_run
from daskhps.training.resume import restore_metrics
from daskhps.training.trainer import Trainer
from tests._clusters import SharedClusters
from tests._logs import generated_logs
from tests._runs import tiny_config

PASS, BATCH = 500, 100


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logs(tmp_path_factory, days=1, rows_per_day=2000, parts_per_day=2, seed=5)


def test_every_pass_records_its_own_bytes_against_the_least_it_needs(
    tmp_path: Path, logs: Path, shared_clusters: SharedClusters
) -> None:
    d = tiny_config(
        tmp_path / "run",
        logs,
        passes={"examples_per_pass": PASS, "global_batch_size": BATCH},
        cluster_section=shared_clusters.section(workers=2, threads=2),
    )
    result = Trainer(RunConfig.from_dict(d, source="test"), progress=False).run()
    path = tmp_path / "run" / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 4
    params = sum(v.numel() for v in result.dense_state.values())
    ring = ring_allreduce_bytes(params * 4, 2)
    for line in lines:
        net = line["network"]
        assert net["ranks"] == 2 and net["batches"] == PASS // BATCH
        for kind in (*KINDS, "total"):
            f = net[kind]
            assert f["sent"] == f["received"] == sum(f["rank_sent"]), kind
            for r in range(2):
                assert f["rank_sent"][r] >= f["rank_min_sent"][r], (kind, r)
                assert f["rank_received"][r] >= f["rank_min_received"][r], (kind, r)
            assert f["ratio"] is None or f["ratio"] >= 1.0
        for kind in ("keys", "rows", "grads", "examples", "pass_keys"):
            assert net[kind]["min"] > 0, kind
        # each rank sends its key counts (8 bytes to the other rank) every batch besides keys
        for r in range(2):
            counts = 8 * net["batches"]
            assert net["keys"]["rank_sent"][r] >= net["keys"]["rank_min_sent"][r] + counts
        # this pass's all-reduces only: counted afresh each pass, not carried over
        assert net["dense"]["rank_sent"] == [net["batches"] * ring] * 2
        assert net["dense"]["ratio"] == 1.0
    # the readers keep the lines whole: the report's, and a resume's
    assert load_run(tmp_path / "run").passes[0]["network"] == lines[0]["network"]
    kept = restore_metrics(path, 2)
    assert [p["network"] for p in kept] == [line["network"] for line in lines[:2]]

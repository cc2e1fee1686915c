"""``daskhps inspect``'s figures: what the stores' bytes count (each table's part of the
checkpoint's total, as recorded when it was taken, never the folders' size today) and the
train loss, rounded in text and exact in ``--json``. No cluster: checkpoints of two tables
written by hand over stores committed here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from daskhps.cli import main
from daskhps.config import RunConfig
from daskhps.runfiles import checkpoint as ck
from daskhps.runfiles import writing
from daskhps.runfiles.checkpoint import checkpoint_name
from daskhps.table import open_shard_store
from daskhps.tiers.store.check import CommitId
from daskhps.tiers.store.layout import tree_bytes
from daskhps.training.inspection import describe, render

LOSS = 0.5462660484313965


def _config(run_dir: Path) -> RunConfig:
    return RunConfig.from_dict(
        {
            "run": {"name": "inspect", "dir": str(run_dir)},
            "data": {"train": {"paths": "logs"}},
            "table": {"dim": 4, "optimizer": {"kind": "adagrad"}},
            "tables": [{"name": "ids", "dim": 8, "features": ["C1", "C2"]}],
            "cluster": {"n_workers": 1, "gpu": False},
        }
    )


def _commit(run_dir: Path, passes_done: int) -> dict[str, Any]:
    """Rows of pass ``passes_done`` in rank 0's store of each table, committed under the
    checkpoint's name: the shard record a checkpoint takes of them (bytes as they are now)."""
    tables = {}
    for spec in _config(run_dir).table_specs():
        path = run_dir / "stores" / spec.name / "rank-0"
        rows = 50 * passes_done * (2 if spec.name == "ids" else 1)
        with open_shard_store(spec, path) as s:
            s.upsert(torch.arange(rows), torch.full((rows, spec.width), float(passes_done)))
            info = s.commit(checkpoint_name(passes_done))
        commit = CommitId(info.seq, info.time, info.rows).to_json()
        tables[spec.name] = {**commit, "store_bytes": tree_bytes(path)}
    first = next(iter(tables.values()))
    return {
        "rank": 0,
        "device_rows": 0,
        "host_rows": 0,
        "store_bytes": sum(t["store_bytes"] for t in tables.values()),
        **{k: v for k, v in first.items() if k != "store_bytes"},
        "tables": tables,
    }


def _checkpoint(run_dir: Path, passes_done: int) -> None:
    cfg = _config(run_dir)
    shard = _commit(run_dir, passes_done)
    folder = writing.start_checkpoint(run_dir, checkpoint_name(passes_done))
    files = writing.write_payload(
        folder, model={}, optimizer={}, rng=[], state={"step": passes_done}
    )
    specs = cfg.table_specs()
    writing.finish_checkpoint(
        folder,
        files,
        {
            "kind": "delta",
            "passes_done": passes_done,
            "step": 10 * passes_done,
            "commit": folder.name,
            "stores_dir": str(run_dir / "stores"),
            "num_workers": 1,
            "num_shards": 4,
            "table": specs[0].layout(),
            "tables": [spec.layout() for spec in specs],
            "config": cfg.to_dict(),
            "train_loss": LOSS,
            "shards": [shard],
        },
    )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    for n in (1, 2):
        _checkpoint(tmp_path, n)
    return tmp_path


def test_the_tables_bytes_add_up_to_the_checkpoints_as_taken(run_dir: Path) -> None:
    first, second = describe(run_dir)["checkpoints"]
    for c in (first, second):
        recorded = json.loads((Path(c["path"]) / ck.MANIFEST).read_text())["shards"][0]
        assert c["store_bytes"] == recorded["store_bytes"] > 0
        assert sum(t["store_bytes"] for t in c["tables"]) == c["store_bytes"]
        assert [t["store_bytes"] for t in c["tables"]] == [
            recorded["tables"][t["name"]]["store_bytes"] for t in c["tables"]
        ]
    # the first checkpoint's figures are its own, not the folders' size after the second
    assert first["tables"][0]["store_bytes"] < second["tables"][0]["store_bytes"]
    assert first["store_bytes_added"] is None
    assert second["store_bytes_added"] == second["store_bytes"] - first["store_bytes"]
    text = render(describe(run_dir))
    assert " on disk when taken (" in text and "more than pass-000001)" in text
    assert text.count(" on disk when taken") == 2 + 2 * 2  # a total and its tables' parts


def test_bytes_not_recorded_are_not_shown(run_dir: Path) -> None:
    """A checkpoint made before each table's bytes were recorded: its tables' lines give no
    bytes, rather than the folders' size today."""
    manifest = run_dir / "checkpoints" / checkpoint_name(2) / ck.MANIFEST
    m = json.loads(manifest.read_text())
    for t in m["shards"][0]["tables"].values():
        del t["store_bytes"]
    manifest.write_text(json.dumps(m))
    c = describe(manifest.parent)["checkpoints"][0]
    assert [t["store_bytes"] for t in c["tables"]] == [None, None]
    lines = render(describe(manifest.parent)).splitlines()
    assert sum(" on disk" in line for line in lines) == 1  # the total only


def test_the_train_loss_is_rounded_in_text_and_exact_in_json(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = render(describe(run_dir))
    assert "train loss 0.54627" in text and str(LOSS) not in text
    assert main(["inspect", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoints"][0]["train_loss"] == LOSS


def test_one_worker_is_said_in_the_singular(run_dir: Path) -> None:
    text = render(describe(run_dir))
    assert ", 4 shards on 1 worker\n" in text and "1 workers" not in text

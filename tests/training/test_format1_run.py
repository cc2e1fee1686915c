"""A run trained before rows had statistics reads, scores and trains on with today's code.

``format1_run/`` is such a run with the predictions that version made (its README says how).
Every test works on a copy of it, beside the same generated logs, in the copy's folder: the
run's config names its logs relative to where it was trained.
"""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from daskhps.data.readers import read_click_log
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.runfiles.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint
from daskhps.table import EmbeddingTable
from daskhps.table.stats import STATS_WIDTH, row_stats
from daskhps.tiers.store.layout import FORMAT
from tests._runs import cli

FIXTURE = Path(__file__).parent / "format1_run"
TRAIN_DAY = "logs/day=2024-01-01"
SCORE_DAY = "logs/day=2024-01-02"
ROWS = [[3326], [5245], [6775]]  # per checkpoint, per rank: its README


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    """The copy's folder: ``run/`` and ``logs/``, as where the run was trained."""
    shutil.copytree(FIXTURE / "run", tmp_path / "run")
    generate(
        GeneratorConfig(days=2, rows_per_day=3000, parts_per_day=2, seed=3, vocab_scale=0.01),
        str(tmp_path / "logs"),
    )
    return tmp_path


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _root(run: Path) -> dict[str, object]:
    meta = json.loads((run / "stores/embeddings/rank-0/zarr.json").read_text())
    return meta["attributes"]["daskhps"]  # type: ignore[no-any-return]


def _predict(folder: Path, *extra: str) -> np.ndarray:
    out = folder / f"pred{len(list(folder.glob('pred*')))}"
    res = cli(
        "predict", "--model", "run", "--data", SCORE_DAY, "--out", str(out), *extra, cwd=folder
    )
    assert res.returncode == 0, res.stderr
    frame = pd.read_parquet(out)
    frame["path"] = frame["file"].astype(str)
    return frame.sort_values(["path", "row"])["probability"].to_numpy()


def _inspect(folder: Path) -> dict[str, object]:
    res = cli("inspect", "run", "--verify", "--json", cwd=folder)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def _stats(ckpt: Checkpoint, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(count, last_day)`` of the rows of ``keys`` in rank 0's store at ``ckpt``."""
    spec = ckpt.table_spec
    with EmbeddingTable.open(
        spec, ckpt.store_path(0), device_rows=16, mode="r", commit=ckpt.commit
    ) as table:
        return row_stats(table.peek(keys), spec.stats_at)


def test_inspect_and_predict_read_it_as_it_was_and_change_nothing(old_run: Path) -> None:
    before = _files(old_run / "run")
    info = _inspect(old_run)
    assert [c["name"] for c in info["checkpoints"]] == ["pass-000001", "pass-000002", "pass-000003"]
    for c in info["checkpoints"]:
        assert c["damage"] == [] and c["format"] == 1
    # the rows that version's inspect counted
    assert [[s["store_rows"] for s in c["shards"]] for c in info["checkpoints"]] == ROWS
    scores = _predict(old_run)
    _as_that_version_scored(scores)
    assert _files(old_run / "run") == before  # reading upgrades nothing
    assert _root(old_run / "run")["format"] == 1


def _as_that_version_scored(scores: np.ndarray) -> None:
    """The same rows and keys scored as that version did. The dense model's float32 sums are
    the CPU's kernels' (AVX2 and AVX-512 round differently, about 1e-7 here), and the fixture
    was made on another machine: bit for bit holds on one machine, checked by the tests
    that score before and after on this one."""
    np.testing.assert_allclose(scores, np.load(FIXTURE / "probabilities.npy"), rtol=0, atol=1e-6)


def test_resuming_it_upgrades_its_stores_and_counts_from_then_on(old_run: Path) -> None:
    before = _predict(old_run, "--checkpoint", "pass-000003")
    _as_that_version_scored(before)
    more = ("--set", "passes.epochs=2", "--set", "checkpoint.keep=6")  # the old ones stay
    res = cli("train", "run/config.yaml", "--resume", *more, cwd=old_run)
    assert res.returncode == 0, res.stderr
    run = old_run / "run"
    root = _root(run)
    old_width = root["narrow_width"]
    assert root["format"] == FORMAT and root["width"] == old_width + STATS_WIDTH  # type: ignore[operator]

    last = latest_checkpoint(run)
    assert last is not None and last.passes_done == 6
    with last.open_store(0) as store:
        keys = store.keys()
    count, last_day = _stats(last, keys)
    # Epoch 2 read the training day once: each key counts its cells there; epoch 1 counted
    # nothing, as the version that trained it kept no statistics.
    frame = read_click_log(str(old_run / TRAIN_DAY)).frame.compute()
    cells = frame[[c for c in frame.columns if c.startswith("C")]].to_numpy().ravel()
    want = pd.Series(cells).value_counts()
    assert sorted(keys.tolist()) == sorted(want.index.tolist())
    assert count.tolist() == want[keys.numpy()].tolist()
    assert set(last_day.tolist()) == {date(2024, 1, 1).toordinal()}

    # The old checkpoints stay readable, with their rows' statistics unknown (zero) ...
    old = load_checkpoint(run / "checkpoints/pass-000003")
    old_count, old_day = _stats(old, keys)
    assert not old_count.any() and not old_day.any()
    info = _inspect(old_run)
    assert [c["damage"] for c in info["checkpoints"]] == [[]] * 6
    assert [[s["store_rows"] for s in c["shards"]] for c in info["checkpoints"][:3]] == ROWS
    # ... and score as that version scored them.
    scores = _predict(old_run, "--checkpoint", "pass-000003")
    assert np.array_equal(scores, before)  # bit for bit, on this machine

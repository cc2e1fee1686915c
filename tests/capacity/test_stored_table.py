"""``plan`` sizes a resumed or imported table by what its stores hold: real stores written by
``daskhps import``, their commit manifests read without opening a store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from daskhps.capacity import size_run
from daskhps.capacity.estimate import index_bytes_holding, index_transient_bytes
from daskhps.capacity.stored import stored_table
from daskhps.cli import main
from daskhps.config.runconfig import load_config
from daskhps.runfiles.checkpoint import latest_checkpoint
from tests._runs import tiny_config, write_config

ROWS = 6000


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose table ``daskhps import`` wrote; the tests only read it."""
    tmp_path = tmp_path_factory.mktemp("imported")
    d = tiny_config(
        tmp_path / "run",
        tmp_path / "logs",
        cluster={"n_workers": 2, "memory_limit": "1GiB"},
        table={"dim": 4},
    )
    config = write_config(tmp_path / "run.yaml", d)
    keys = np.random.default_rng(0).choice(1 << 62, ROWS, replace=False)
    rows = np.random.default_rng(1).standard_normal((ROWS, 4), dtype=np.float32)
    np.save(tmp_path / "keys.npy", keys)
    np.save(tmp_path / "rows.npy", rows)
    args = ["--keys", str(tmp_path / "keys.npy"), "--rows", str(tmp_path / "rows.npy")]
    assert main(["import", str(config), "--quiet", *args]) == 0
    return config


def test_rows_per_rank_are_the_stores_lengths(imported: Path) -> None:
    cfg = load_config(imported)
    stored = stored_table(cfg.run.dir)
    ckpt = latest_checkpoint(cfg.run.dir)
    assert stored is not None and ckpt is not None
    assert stored.checkpoint == ckpt.name
    lengths = []
    for rank in range(ckpt.num_workers):
        with ckpt.open_store(rank) as store:
            lengths.append(len(store))
    assert list(stored.rows_per_rank) == lengths and sum(lengths) == ROWS
    assert stored.busiest == max(lengths)


def test_plan_sizes_the_index_the_resume_opens(
    imported: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = load_config(imported)
    report = size_run(cfg)
    assert report.stored is not None and report.memory is not None
    busiest = report.stored.busiest
    # The logs bring fewer keys than the store holds: the index is sized at open.
    assert (report.keys.keys_per_owner or 0) < busiest
    ckpt = latest_checkpoint(cfg.run.dir)
    assert ckpt is not None
    opened = []
    for rank in range(ckpt.num_workers):
        with ckpt.open_store(rank) as store:
            opened.append(store.stats.extra["index_bytes"])
    assert index_bytes_holding(busiest, busiest) == max(opened)
    assert report.memory.store >= index_bytes_holding(busiest, busiest)
    assert report.memory.store_index == index_transient_bytes(busiest, busiest) == 16 * busiest
    # A fresh run (train without --resume) starts without those stores.
    fresh = size_run(cfg, resume=False)
    assert fresh.stored is None and fresh.memory is not None
    assert fresh.memory.store < report.memory.store
    assert main(["plan", str(imported)]) == 0
    assert f"the busiest worker opens {busiest:,}" in capsys.readouterr().out


def test_no_checkpoint_no_stored_table(tmp_path: Path) -> None:
    assert stored_table(tmp_path / "nothing") is None
    (tmp_path / "empty").mkdir()
    assert stored_table(tmp_path / "empty") is None


def test_the_rows_come_from_the_checkpoint_when_the_stores_are_on_other_disks(
    imported: Path, tmp_path: Path
) -> None:
    """On several machines the driver sees none of the stores: the checkpoint's record of each
    rank's commit says how many rows it holds."""
    cfg = load_config(imported)
    ckpt = latest_checkpoint(cfg.run.dir)
    assert ckpt is not None
    here = stored_table(cfg.run.dir)
    stores = ckpt.stores_dir
    stores.rename(tmp_path / "elsewhere")
    try:
        assert stored_table(cfg.run.dir) == here
        assert here is not None and sum(here.rows_per_rank) == ROWS
    finally:
        (tmp_path / "elsewhere").rename(stores)

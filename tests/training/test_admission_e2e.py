"""Admission end to end (invariant 9) on a real two-worker LocalCluster whose workers stage
the next pass while the current one trains: exactly the keys whose count reached
``min_count`` have rows, each counting all its occurrences; every other key's count waits in
the pending counts committed with the stores, each checkpoint holding the counts of the
passes it covers and no more; a re-shard carries them to the keys' new owners."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from daskhps.data.readers import read_click_log
from daskhps.runfiles.checkpoint import list_checkpoints
from daskhps.table.admission import PendingCounts
from daskhps.training.inspection import describe, render
from daskhps.training.resume import reshard
from daskhps.training.trainer import Trainer
from tests._clusters import SharedClusters
from tests._logs import generated_logs
from tests.training.test_train_e2e import PASS, _config, _rows, _run

MIN_COUNT = 3
ROWS_PER_DAY = 3000


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logs(
        tmp_path_factory, days=2, rows_per_day=ROWS_PER_DAY, parts_per_day=2, seed=3
    )


def _occurrences(logs: Path, rows: int | None = None) -> pd.DataFrame:
    """Each key's occurrences and last day in the first ``rows`` rows of the logs (all by
    default), against pandas."""
    frame = read_click_log(str(logs)).frame.compute()
    days = [p.name.removeprefix("day=") for p in sorted(logs.glob("day=*"))]
    day = np.repeat([date.fromisoformat(d).toordinal() for d in days], ROWS_PER_DAY)
    cats = frame[[c for c in frame.columns if c.startswith("C")]].to_numpy()[:rows]
    day = day[: len(cats)]
    cells = pd.DataFrame({"key": cats.ravel(), "day": np.repeat(day, cats.shape[1])})
    return cells.groupby("key")["day"].agg(["size", "max"])


def _pending(store_paths: list[Path], spec: object, commit: str | None = None) -> PendingCounts:
    from daskhps.table import open_shard_store

    parts = []
    for path in store_paths:
        with open_shard_store(spec, path, mode="r", commit=commit) as s:  # type: ignore[arg-type]
            parts.append(
                PendingCounts.from_arrays(
                    s.attached(PendingCounts.KEYS), s.attached(PendingCounts.STATS)
                )
            )
    return PendingCounts.merged(parts)


def test_keys_get_rows_once_their_count_reaches_min_count(
    tmp_path: Path,
    logs: Path,
    shared_clusters: SharedClusters,
) -> None:
    cfg = _config(
        tmp_path,
        logs,
        shared_clusters.section(workers=2, threads=2),
        **{
            "data.holdout": None,
            "table.admission": {"min_count": MIN_COUNT},
            "checkpoint": {"every_passes": 1, "keep": 100},
        },
    )
    result = _run(cfg)
    want = _occurrences(logs)
    admitted = want[want["size"] >= MIN_COUNT]
    held = want[want["size"] < MIN_COUNT]
    assert len(admitted) and len(held)

    rows = _rows(cfg, 2)
    assert sorted(rows) == admitted.index.tolist()
    spec = cfg.table_spec()
    stats = np.ascontiguousarray(np.stack([rows[k] for k in admitted.index])[:, spec.stats_at :])
    assert stats.view(np.int32)[:, 0].tolist() == admitted["size"].tolist()  # all occurrences
    assert stats.view(np.int32)[:, 1].tolist() == admitted["max"].tolist()

    stores = [Path(cfg.table.tiers.store_dir) / spec.name / f"rank-{r}" for r in range(2)]
    pending = _pending(stores, spec)
    assert pending.keys.tolist() == held.index.tolist()
    assert pending.stats[:, 0].tolist() == held["size"].tolist()
    assert pending.stats[:, 1].tolist() == held["max"].tolist()

    # metrics.jsonl: the keys admitted per pass add up to the rows, the last pass's pending
    # keys are those held back, 16 bytes each
    lines = result.passes
    assert sum(line["admission"]["admitted"] for line in lines) == len(admitted)
    assert lines[-1]["admission"]["pending_keys"] == len(held)
    assert lines[-1]["admission"]["pending_bytes"] == 16 * len(held)
    assert all("admit" in line["seconds"] for line in lines)

    # inspect shows them beside the rows
    info = describe(cfg.run.dir)
    assert info["checkpoints"][-1]["rows"] == len(admitted)
    assert info["checkpoints"][-1]["pending_keys"] == len(held)
    assert f"{len(held):,} more keys seen, not admitted yet" in render(info)

    # The first checkpoint counts its pass only: pass 2, prepared and staged meanwhile,
    # leaked nothing into it.
    first = list_checkpoints(cfg.run.dir)[0]
    assert first.passes_done == 1
    early = _occurrences(logs, PASS)
    early_held = early[early["size"] < MIN_COUNT]
    got = _pending(stores, spec, first.commit)
    assert got.keys.tolist() == early_held.index.tolist()
    assert got.stats[:, 0].tolist() == early_held["size"].tolist()

    # A re-shard onto one worker carries every pending count to its key's new owner.
    last = list_checkpoints(cfg.run.dir)[-1]
    out = reshard(last, 1, tmp_path / "resharded")
    moved = _pending([out / spec.name / "rank-0"], spec, last.commit)
    assert moved.keys.tolist() == pending.keys.tolist()
    assert moved.stats.tolist() == pending.stats.tolist()

    # Resumed from its second checkpoint, the run ends as it did: every row bit for bit,
    # every pending count.
    Trainer(cfg, progress=False).run(resume=True, overwrite=True, checkpoint="pass-000002")
    again = _rows(cfg, 2)
    assert again.keys() == rows.keys()
    assert all(np.array_equal(again[k].view(np.int32), rows[k].view(np.int32)) for k in rows)
    resumed = _pending(stores, spec)
    assert resumed.keys.tolist() == pending.keys.tolist()
    assert resumed.stats.tolist() == pending.stats.tolist()


@pytest.mark.parametrize("probability", [0.5])
def test_probability_admits_fewer_keys_the_same_way_on_any_worker_count(
    tmp_path: Path,
    logs: Path,
    shared_clusters: SharedClusters,
    probability: float,
) -> None:
    """A probability below 1 holds back some keys that reached min_count, and which ones
    does not depend on the worker count."""
    admitted = []
    for workers in (1, 2):
        cfg = _config(
            tmp_path / f"w{workers}",
            logs,
            shared_clusters.section(workers=workers, threads=1),
            **{
                "data.holdout": None,
                "passes.examples_per_pass": 2 * PASS,
                "table.admission": {"min_count": 2, "probability": probability},
            },
        )
        _run(cfg)
        admitted.append(sorted(_rows(cfg, workers)))
    want = _occurrences(logs)
    reached = want[want["size"] >= 2]
    assert admitted[0] == admitted[1]
    assert set(admitted[0]) < set(reached.index)
    assert 0.3 * len(reached) < len(admitted[0]) < len(reached)

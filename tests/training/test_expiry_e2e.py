"""Expiry end to end (invariant 10) on a real LocalCluster over four drifting log days: at
each day boundary exactly the rows a day-by-day model expires leave every tier, with the
pending counts of keys not admitted; what stays counts exactly; an expired key reads its
initial value; the stores check clean."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from daskhps.data.readers import read_click_log
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.serve import load_servable
from daskhps.serve.export import KEYS, export_model
from daskhps.sharding import shard_of
from daskhps.table import EmbeddingTable
from daskhps.table.read_path import initial_rows
from daskhps.tiers.store.check import StoreChecker
from daskhps.training.inspection import describe, render
from tests._clusters import SharedClusters
from tests._runs import cli_here
from tests.training.test_admission_e2e import _pending
from tests.training.test_train_e2e import _config, _rows, _run

DAYS, ROWS_PER_DAY = 4, 2000


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("drifting")
    generate(
        GeneratorConfig(
            days=DAYS,
            rows_per_day=ROWS_PER_DAY,
            parts_per_day=2,
            seed=5,
            vocab_scale=0.002,
            drift=0.3,
            one_off=0.2,
        ),
        out,
    )
    return out


def _day_counts(logs: Path) -> list[pd.Series]:
    """Each day's key occurrences (a Series: key -> count), in day order."""
    out = []
    for folder in sorted(logs.glob("day=*")):
        frame = read_click_log(str(folder)).frame.compute()
        cats = frame[[c for c in frame.columns if c.startswith("C")]].to_numpy().ravel()
        out.append(pd.Series(cats).value_counts().sort_index())
    return out


def _model(
    logs: Path, *, ttl: int | None, min_count: int, max_rows: int | None, shards: int
) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]], int, dict[str, tuple[int, int]]]:
    """Rows and pending counts (key -> (count, last day)) after every day, day by day, the
    rows expired in all, and the keys admitted and rows expired on each day."""
    rows: dict[int, tuple[int, int]] = {}
    pending: dict[int, tuple[int, int]] = {}
    expired = 0
    per_day: dict[str, tuple[int, int]] = {}  # day -> (keys admitted, rows expired)
    days = [
        date.fromisoformat(p.name.removeprefix("day=")).toordinal()
        for p in sorted(logs.glob("day=*"))
    ]
    for d, counts in zip(days, _day_counts(logs), strict=True):
        admitted = 0
        for k, c in counts.items():
            if k in rows:
                rows[k] = (rows[k][0] + c, d)
            else:
                total = pending.pop(k, (0, 0))[0] + c
                (rows if total >= min_count else pending)[k] = (total, d)
                admitted += total >= min_count
        gone = {k for k, (_, last) in rows.items() if ttl is not None and last <= d - ttl}
        if max_rows is not None:
            share = -(-max_rows // shards)
            alive = [k for k in rows if k not in gone]
            by_shard: dict[int, list[int]] = {}
            for k, s in zip(alive, shard_of(np.array(alive, np.int64), shards), strict=True):
                by_shard.setdefault(int(s), []).append(k)
            for ks in by_shard.values():
                ks.sort(key=lambda k: (rows[k][0], rows[k][1], k), reverse=True)
                gone.update(ks[share:])
        expired += len(gone)
        per_day[date.fromordinal(d).isoformat()] = (admitted, len(gone))
        for k in gone:
            del rows[k]
        for k in [k for k, (_, last) in pending.items() if ttl is not None and last <= d - ttl]:
            del pending[k]
    return rows, pending, expired, per_day


def _check(cfg: Any, workers: int, result: Any, want: tuple[dict, dict, int, dict]) -> None:
    rows, pending, expired, per_day = want
    spec = cfg.table_spec()
    got = _rows(cfg, workers)
    assert sorted(got) == sorted(rows)
    stats = np.ascontiguousarray(np.stack([got[k] for k in sorted(rows)])[:, spec.stats_at :])
    assert [tuple(s) for s in stats.view(np.int32).tolist()] == [rows[k] for k in sorted(rows)]
    stores = [Path(cfg.table.tiers.store_dir) / spec.name / f"rank-{r}" for r in range(workers)]
    left = _pending(stores, spec)
    assert left.keys.tolist() == sorted(pending)
    assert [tuple(s) for s in left.stats.tolist()] == [pending[k] for k in sorted(pending)]
    ends = [line["expiry"] for line in result.passes if "expiry" in line]
    # the stage's seconds reach the pass's record, as count's do
    assert all("expire" in line["seconds"] for line in result.passes if "expiry" in line)
    assert [e["day"] for e in ends] == [
        p.name[4:] for p in sorted(Path(cfg.data.train.paths[0]).glob("day=*"))
    ]
    assert sum(e["expired"] for e in ends) == expired
    for path in stores:
        assert StoreChecker(verify=True).check(path).ok
    # inspect: keys admitted and rows expired per day, from the last checkpoint
    info = describe(cfg.run.dir)["checkpoints"][-1]
    admits = cfg.table.admission.min_count > 1
    per_day = {day: (a if admits else 0, e) for day, (a, e) in per_day.items()}
    got_days = {day: (v["admitted"], v["expired"]) for day, v in info["lifecycle"].items()}
    assert got_days == per_day
    assert "keys admitted / rows expired per day" in render(describe(cfg.run.dir))


def test_rows_unseen_for_ttl_days_leave_the_table(
    tmp_path: Path, logs: Path, shared_clusters: SharedClusters
) -> None:
    """ttl_days 2 and min_count 2 on two pipelined workers: rows and pending counts equal
    the day-by-day model's; an expired key reads its initial value. Admission, counting and
    expiry ride in calls each pass makes anyway (its training, its release), so they add
    no call of their own."""
    from distributed import Client, get_task_stream

    cfg = _config(
        tmp_path,
        logs,
        shared_clusters.section(workers=2, threads=2),
        **{
            "data.holdout": None,
            "table.admission": {"min_count": 2},
            "table.expiry": {"ttl_days": 2},
        },
    )
    with Client(cfg.cluster.address) as client, get_task_stream(client) as stream:
        result = _run(cfg)
    keys = pd.Series([str(t["key"]) for t in stream.data])  # daskhps-<what>-<rank>-<ns>
    calls = keys[keys.str.startswith("daskhps-")].str.split("-").str[1:-2].str.join("-")
    passes = len(result.passes)
    assert (calls == "train-pass").sum() == 2 * passes  # admit + batches, on each rank
    assert (calls == "end-pass").sum() == 2 * passes  # count + expire + unpin
    assert not calls.isin(["admit-keys", "count-keys", "expire-rows", "unpin"]).any()
    assert sum("expiry" in line for line in result.passes) == DAYS  # one end of a day each
    want = _model(logs, ttl=2, min_count=2, max_rows=None, shards=cfg.passes.plan.num_shards)
    assert want[2] > 0
    _check(cfg, 2, result, want)
    first_day = _day_counts(logs)[0]
    gone = [k for k in first_day.index if k not in want[0]][:50]
    spec = cfg.table_spec()
    path = Path(cfg.table.tiers.store_dir) / spec.name / "rank-0"
    with EmbeddingTable.open(spec, path, device_rows=64, mode="r") as t:
        keys = torch.tensor(gone)
        assert torch.equal(t.peek(keys), initial_rows(spec, keys))
    # an export holds exactly the rows that stayed: expired keys are absent, as unseen ones
    export_model(load_servable(cfg.run.dir), tmp_path / "export")
    assert sorted(np.load(tmp_path / "export" / KEYS).tolist()) == sorted(want[0])


def test_max_rows_keeps_each_shards_most_frequent_rows(
    tmp_path: Path, logs: Path, shared_clusters: SharedClusters
) -> None:
    cfg = _config(
        tmp_path,
        logs,
        shared_clusters.section(workers=1, threads=1),
        **{"data.holdout": None, "table.expiry": {"max_rows": 300, "score": "lfu"}},
    )
    result = _run(cfg)
    want = _model(logs, ttl=None, min_count=1, max_rows=300, shards=cfg.passes.plan.num_shards)
    assert want[2] > 0 and len(want[0]) <= 300 + cfg.passes.plan.num_shards
    _check(cfg, 1, result, want)


def test_ttl_days_on_logs_without_days_is_one_line_and_changes_nothing(
    tmp_path: Path,
    logs: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Logs outside day=YYYY-MM-DD folders: a ttl_days run stops before any cluster starts,
    in one line naming the key and the file, and an earlier run in its folder is untouched."""
    flat = tmp_path / "flat"
    flat.mkdir()
    for i, part in enumerate(sorted(logs.glob("day=*/*.tsv"))[:2]):
        (flat / f"part-{i}.tsv").write_bytes(part.read_bytes())
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"pass": 1}\n')
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    cfg = tmp_path / "ttl.yaml"
    cfg.write_text(
        f"run: {{name: ttl, dir: {run}}}\n"
        f"data: {{train: {{paths: [{flat}]}}}}\n"
        "table: {expiry: {ttl_days: 3}}\n"
        "cluster: {n_workers: 1, gpu: false, dashboard_address: null}\n"
    )
    res = cli_here(capfd, caplog, "train", str(cfg), "--overwrite")
    assert res.returncode == 1, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "table.expiry.ttl_days" in line and "part-0.tsv" in line and "max_rows" in line
    assert "Traceback" not in res.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before

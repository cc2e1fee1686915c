"""The pass plan: every example once, batches split over workers, deterministic; owner keys
equal a reference computed directly in pandas."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import dask
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.data import ClickLog
from daskhps.errors import CapacityError, ConfigError
from daskhps.options import Ctx, validate
from daskhps.passes import (
    PassConfig,
    PassSpec,
    build_plan,
    owner_keys,
    pass_keys,
    plan_owner_keys,
    select_examples,
    split_batch,
)
from daskhps.sharding import ShardMap

CAT = [f"C{i}" for i in range(1, 27)]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 64))
def test_split_batch(size: int, workers: int) -> None:
    b = split_batch(size, workers)
    shares = np.diff(b)
    assert b[0] == 0 and b[-1] == size and len(shares) == workers
    assert shares.max() - shares.min() <= 1 and (np.diff(shares) <= 0).all()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 64),
    st.integers(1, 5),
    st.booleans(),
)
def test_pass_spec_covers_each_example_once(n: int, batch: int, workers: int, shuf: bool) -> None:
    spec = PassSpec(0, 100, 100 + n, batch, workers, seed=3, shuffled=shuf)
    per_worker = [np.concatenate(spec.worker_examples(w)) for w in range(workers)]
    allv = np.sort(np.concatenate(per_worker))
    assert allv.tolist() == list(range(100, 100 + n))
    first = spec.worker_examples(0)
    for b in range(0, spec.num_batches, max(1, spec.num_batches // 5)):
        parts = [spec.worker_batch(b, w) for w in range(workers)]
        assert np.concatenate(parts).tolist() == spec.batch(b).tolist()
        assert parts[0].tolist() == first[b].tolist()
    if not shuf:
        assert spec.order().tolist() == list(range(100, 100 + n))


def test_plan_passes_and_determinism(click_log: ClickLog) -> None:
    cfg = PassConfig(examples_per_pass=5000, global_batch_size=512, shuffle_examples=True)
    plan = build_plan(click_log, cfg, num_workers=2, seed=1)
    assert plan.num_examples == 12000
    assert [p.num_examples for p in plan.passes] == [5000, 5000, 2000]
    again = build_plan(click_log, cfg, num_workers=2, seed=1)
    assert again == plan
    assert again.passes[0].order().tolist() == plan.passes[0].order().tolist()
    other = build_plan(click_log, cfg, num_workers=2, seed=2)
    assert other.passes[0].order().tolist() != plan.passes[0].order().tolist()
    assert plan.summary()["passes"] == 3


def test_select_examples(click_log: ClickLog) -> None:
    full = click_log.frame.compute().reset_index(drop=True)
    lengths = [int(x) for x in click_log.frame.map_partitions(len).compute()]
    for a, b in [(0, 10), (1990, 2010), (3999, 8001), (11990, 12000), (0, 12000), (5, 5)]:
        got = select_examples(click_log.frame, lengths, a, b).compute()
        want = full.iloc[a:b].reset_index(drop=True)
        pd.testing.assert_frame_equal(got.reset_index(drop=True), want)


def test_owner_keys_equal_pandas_reference(click_log: ClickLog) -> None:
    cfg = PassConfig(examples_per_pass=7000, global_batch_size=1000, num_shards=16)
    plan = build_plan(click_log, cfg, num_workers=3, seed=0)
    shard_map = ShardMap(16, 3)
    full = click_log.frame.compute().reset_index(drop=True)
    # Each row's log day, from its partition's day= folder.
    days = [date.fromisoformat(str(d)).toordinal() for d in click_log.part_days()]
    full["day"] = np.repeat(days, plan.partition_lengths)
    assert len(set(days)) == 2
    for spec in plan.passes:
        parts = dask.compute(*plan_owner_keys(click_log, plan, spec, shard_map).to_delayed())
        rows = full.iloc[spec.start : spec.stop]
        cells = pd.DataFrame(
            {"key": rows[CAT].to_numpy().ravel(), "day": np.repeat(rows["day"].to_numpy(), 26)}
        )
        ref = cells.groupby("key")["day"].agg(["size", "max"]).reset_index()
        ref["shard"] = shard_map.shard(ref["key"].to_numpy())
        ref["worker"] = shard_map.worker_of_shard[ref["shard"]]
        assert len(parts) == 3
        for w, part in enumerate(parts):
            want = ref[ref.worker == w].sort_values(["shard", "key"])
            assert part["key"].tolist() == want["key"].tolist()
            assert part["shard"].tolist() == want["shard"].tolist()
            assert part["count"].tolist() == want["size"].tolist()  # occurrences in the pass
            assert part["day"].tolist() == want["max"].tolist()  # the latest day of the key
            assert (part["worker"] == w).all()


@pytest.mark.parametrize("method", ["tasks", "disk"])
def test_owner_keys_shuffle_methods(method: str) -> None:
    import dask.dataframe as dd

    key = np.arange(-500, 2000, dtype=np.int64) * 7919
    one = pd.DataFrame({"key": key, "count": 1, "day": np.int32(5)})
    two = pd.DataFrame({"key": key, "count": np.int64(2), "day": np.int32(9)})
    ddf = dd.from_pandas(pd.concat([one, two]), npartitions=5)
    sm = ShardMap(8, 2)
    parts = dask.compute(*owner_keys(ddf, sm, shuffle_method=method).to_delayed())
    got = pd.concat(parts).sort_values("key")
    assert got["key"].tolist() == sorted(key.tolist())
    assert (got["count"] == 3).all() and (got["day"] == 9).all()
    for w, p in enumerate(parts):
        assert (sm.worker(p.key.to_numpy()) == w).all()


def test_max_working_set_splits_at_batch_boundaries(click_log: ClickLog) -> None:
    lengths = [int(x) for x in click_log.frame.map_partitions(len).compute()]
    whole = int(pass_keys(click_log, lengths, 0, 6000)["key"].nunique().compute())
    cap = whole // 2
    cfg = PassConfig(examples_per_pass=6000, global_batch_size=250, max_working_set=cap)
    plan = build_plan(click_log, cfg, num_workers=2, partition_lengths=lengths)
    assert len(plan.passes) > 2
    assert plan.passes[0].start == 0 and plan.passes[-1].stop == 12000
    for p, q in zip(plan.passes, plan.passes[1:], strict=False):
        assert p.stop == q.start
    for p in plan.passes:
        assert (p.start % 250 == 0) and (p.num_examples % 250 == 0 or p.stop == 12000)
        u = int(pass_keys(click_log, lengths, p.start, p.stop)["key"].nunique().compute())
        assert u <= cap
    tiny = PassConfig(examples_per_pass=6000, global_batch_size=250, max_working_set=10)
    with pytest.raises(CapacityError, match="lower global_batch_size or raise max_working_set"):
        build_plan(click_log, tiny, num_workers=1, partition_lengths=lengths)


def test_pass_config_from_a_mapping() -> None:
    def from_dict(d: dict[str, object], source: str = "<dict>") -> PassConfig:
        return validate(PassConfig, d, Ctx(source), "passes")

    cfg = from_dict(
        {"examples_per_pass": 1000, "global_batch_size": 100, "shuffle_method": "tasks"}
    )
    assert cfg.num_shards == 64 and cfg.max_working_set is None
    with pytest.raises(ConfigError, match=r"run\.yaml: passes\.batch: unknown key"):
        from_dict({"batch": 1}, "run.yaml")
    with pytest.raises(ConfigError, match=r"run\.yaml: .*global_batch_size.*must not exceed"):
        from_dict({"examples_per_pass": 10, "global_batch_size": 100}, "run.yaml")
    with pytest.raises(ConfigError, match="shuffle_method"):
        from_dict({"examples_per_pass": 10, "global_batch_size": 1, "shuffle_method": "magic"})


@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=12),
    per_pass=st.integers(1, 40),
)
def test_passes_per_partition_counts_the_passes_that_read_it(
    lengths: list[int], per_pass: int
) -> None:
    from daskhps.passes.config import PassConfig
    from daskhps.passes.plan import PassPlan, PassSpec

    total = sum(lengths)
    passes = tuple(
        PassSpec(i, a, min(a + per_pass, total), per_pass, 1, 0)
        for i, a in enumerate(range(0, total, per_pass))
    )
    files = tuple(f"f{i}" for i in range(len(lengths)))
    plan = PassPlan(
        passes,
        files,
        tuple(lengths),
        PassConfig(examples_per_pass=per_pass, global_batch_size=per_pass),
        1,
        0,
    )
    got = plan.passes_per_partition()
    begin = 0
    for i, n in enumerate(lengths):
        rows = set(range(begin, begin + n))
        want = sum(1 for p in passes if rows & set(range(p.start, p.stop)))
        assert got[i] == want
        begin += n


def test_a_run_warns_of_files_read_whole_by_many_passes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only files that could not be cut into blocks and are larger than one say so."""
    from daskhps.passes.config import PassConfig
    from daskhps.passes.plan import PassPlan, PassSpec, warn_rereads

    big, small = tmp_path / "big.tsv.gz", tmp_path / "small.tsv"
    big.write_bytes(b"x" * 5000)
    small.write_bytes(b"x" * 100)
    passes = tuple(PassSpec(i, 10 * i, 10 * i + 10, 5, 1, 0) for i in range(6))
    plan = PassPlan(
        passes,
        (str(big), str(small)),
        (30, 30),
        PassConfig(examples_per_pass=10, global_batch_size=5),
        1,
        0,
    )
    with caplog.at_level("WARNING"):
        warn_rereads(plan, 1000)
    (record,) = [r for r in caplog.records if "read whole" in r.getMessage()]
    assert "1 input files" in record.getMessage() and "big.tsv.gz by 3" in record.getMessage()
    caplog.clear()
    with caplog.at_level("WARNING"):
        warn_rereads(plan, 10_000)  # both within a block: cheap to read again
    assert not [r for r in caplog.records if "read whole" in r.getMessage()]

"""Skipped click-log rows are reported in the metrics of the pass that reads their file."""

from __future__ import annotations

from daskhps.passes import PassConfig, PassPlan, PassSpec
from daskhps.passes.plan import bad_rows_by_pass


def test_bad_rows_are_attributed_to_the_pass_that_reads_their_file() -> None:
    passes = tuple(PassSpec(i, 10 * i, 10 * i + 10, 5, 1, 0) for i in range(3))
    plan = PassPlan(
        passes,
        ("a", "b", "c", "d"),
        (12, 0, 8, 10),
        PassConfig(examples_per_pass=10, global_batch_size=5),
        1,
        0,
    )
    by_file = {"a": {"label_invalid": 2}, "b": {"empty_shard": 1}, "d": {"label_invalid": 3}}
    # a starts at 0 (pass 0); b (empty) and c start at 12 (pass 1); d starts at 20 (pass 2)
    assert bad_rows_by_pass(by_file, plan) == {
        0: {"label_invalid": 2},
        1: {"empty_shard": 1},
        2: {"label_invalid": 3},
    }

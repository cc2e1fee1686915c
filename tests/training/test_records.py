"""The typed pass record: built from every rank's result, written as the metrics.jsonl line."""

from __future__ import annotations

from daskhps.training.records import Batches, PassRecord, RankPassResult

# The keys of a metrics.jsonl line, in the order they are written (the run report, the
# dashboard and users' scripts read them by name).
LINE_KEYS = [
    "pass",
    "pass_in_epoch",
    "examples",
    "examples_per_s",
    "train_loss",
    "batch_losses",
    "rows_staged",
    "staged_from",
    "worker_seconds",
    "eval",
    "tiers",
    "seconds",
    "epoch",
    "bad_rows_skipped",
    "network",
]


def _ranks() -> list[RankPassResult]:
    # 10 examples in global batches of 4: 4, 4 and 2 examples, split over two ranks
    return [
        RankPassResult(0, 5, 3.0, [1.0, 1.5, 0.5], {"pull": 0.2, "push": 0.1}),
        RankPassResult(1, 5, 2.0, [1.0, 0.5, 0.5], {"pull": 0.3, "push": 0.05}),
    ]


def _record(train_seconds: float) -> PassRecord:
    return PassRecord.of_ranks(
        _ranks(),
        pass_number=1,
        pass_in_epoch=1,
        batches=Batches(batch_size=4, num_batches=3, num_examples=10),
        train_seconds=train_seconds,
        rows_staged=7,
        staged_from={"device": 0, "host": 0, "store": 2, "init": 5},
    )


def test_losses_are_sums_over_the_global_batch_and_seconds_the_slowest_rank() -> None:
    rec = _record(train_seconds=2.0)
    assert rec.train_loss == 5.0 / 10
    assert rec.batch_losses == [2.0 / 4, 2.0 / 4, 1.0 / 2]  # the last batch holds 2 examples
    assert rec.examples_per_s == 5.0
    assert rec.worker_seconds == {"pull": 0.3, "push": 0.1}
    assert rec.rows_staged == 7 and rec.staged_from["init"] == 5


def test_the_line_keeps_its_keys_and_leaves_eval_out_when_not_evaluated() -> None:
    rec = _record(train_seconds=0.0)
    assert rec.examples_per_s == 0.0 and rec.auc is None
    assert list(rec.to_json()) == [k for k in LINE_KEYS if k != "eval"]
    rec.eval = {"auc": 0.75, "logloss": 0.5}
    line = rec.to_json()
    assert list(line) == LINE_KEYS and line["pass"] == 1 and rec.auc == 0.75

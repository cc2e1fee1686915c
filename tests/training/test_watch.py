"""The holdout watch (daskhps.training.watch) against a model written from its definitions:
the run's model is the earliest checkpoint with the best ``best_by``; an early stop comes at
the first evaluation that ends ``patience`` evaluations in a row without a strictly better
value; divergence at the first pass whose holdout logloss exceeds ``diverge_factor`` times the
lowest before it, or whose loss is not a number."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.config.training import EvalConfig
from daskhps.runfiles.checkpoint import checkpoint_name
from daskhps.training.watch import Best, ModelWatch, Stop

# Values on a coarse grid so that ties, the ones a best must break by order, are common.
_AUC = st.sampled_from([0.6, 0.65, 0.7, 0.72, 0.75])
_LOSS = st.sampled_from([0.4, 0.45, 0.5, 0.7, 0.9])
_PASSES = st.lists(st.tuples(_AUC, _LOSS, st.booleans()), min_size=1, max_size=12)


def _model_stop(
    passes: list[tuple[float, float, bool]], by: str, patience: int | None, factor: float | None
) -> tuple[int | None, str | None]:
    """(0-based index, kind) of the pass the run stops at, from the definitions."""
    values = [a if by == "auc" else -loss for a, loss, _ in passes]
    last_better = None
    for i, (_, loss, _) in enumerate(passes):
        if factor is not None and i and loss > factor * min(p[1] for p in passes[:i]):
            return i, "diverged"
        if i == 0 or values[i] > max(values[:i]):
            last_better = i
        assert last_better is not None
        if patience is not None and i - last_better >= patience:
            return i, "early"
    return None, None


def _model_best(passes: list[tuple[float, float, bool]], by: str, upto: int) -> int | None:
    """The earliest checkpointed pass (index) with the best value among the first ``upto``."""
    kept = [i for i in range(upto) if passes[i][2]]
    if not kept:
        return None
    sign = 1 if by == "auc" else -1
    top = max(sign * (passes[i][0] if by == "auc" else passes[i][1]) for i in kept)
    return next(i for i in kept if sign * (passes[i][0] if by == "auc" else passes[i][1]) == top)


@settings(max_examples=300, deadline=None)
@given(
    passes=_PASSES,
    by=st.sampled_from(["auc", "logloss"]),
    patience=st.sampled_from([None, 1, 2, 3]),
    factor=st.sampled_from([None, 1.5, 2.0]),
)
def test_the_watch_matches_its_definitions(
    passes: list[tuple[float, float, bool]], by: str, patience: int | None, factor: float | None
) -> None:
    rule = EvalConfig(best_by=by, patience=patience, diverge_factor=factor)
    watch = ModelWatch(rule)
    stopped: Stop | None = None
    done = len(passes)
    for i, (auc, loss, checkpointed) in enumerate(passes):
        metrics = {"auc": auc, "logloss": loss, "ctr": 0.25}
        stopped = watch.observe(i + 1, 0.5, metrics)
        if stopped is not None and stopped.kind == "diverged":
            done = i  # the diverged pass is never a checkpoint
            break
        if checkpointed or stopped is not None:  # an early stop checkpoints its last pass
            watch.checkpointed(checkpoint_name(i + 1), i + 1, metrics)
        if stopped is not None:
            done = i + 1
            break
    at, kind = _model_stop(passes, by, patience, factor)
    assert (stopped.kind if stopped else None) == kind
    assert (stopped.passes_done - 1 if stopped else None) == at
    flags = [c or (kind == "early" and i == at) for i, (_, _, c) in enumerate(passes)]
    best = _model_best([(a, lo, f) for (a, lo, _), f in zip(passes, flags, strict=True)], by, done)
    assert (watch.best.passes_done - 1 if watch.best else None) == best
    if watch.best is not None:
        assert watch.best.checkpoint == checkpoint_name(watch.best.passes_done)
        assert watch.best.metric == by


@settings(max_examples=100, deadline=None)
@given(passes=_PASSES, patience=st.sampled_from([None, 2, 3]))
def test_a_resumed_watch_decides_as_the_uninterrupted_one(
    passes: list[tuple[float, float, bool]], patience: int | None
) -> None:
    # a resume rebuilds the watch from metrics.jsonl and the kept checkpoints
    rule = EvalConfig(patience=patience, diverge_factor=None)
    whole = ModelWatch(rule)
    records = []
    for i, (auc, loss, _) in enumerate(passes):
        metrics = {"auc": auc, "logloss": loss, "ctr": 0.25}
        if whole.observe(i + 1, 0.5, metrics) is not None:
            return
        whole.checkpointed(checkpoint_name(i + 1), i + 1, metrics)
        records.append({"pass": i + 1, "train_loss": 0.5, "eval": metrics})
    for cut in range(len(records) + 1):
        again = ModelWatch.resumed(rule, records[:cut])
        for r in records[:cut]:
            again.checkpointed(checkpoint_name(r["pass"]), r["pass"], r["eval"])
        assert (again.since_best, again.best_value) == (
            _since(whole, records, cut),
            _best_value(records[:cut]),
        )


def _best_value(records: list[dict]) -> float | None:
    return max((r["eval"]["auc"] for r in records), default=None)


def _since(whole: ModelWatch, records: list[dict], cut: int) -> int:
    aucs = [r["eval"]["auc"] for r in records[:cut]]
    if not aucs:
        return 0
    last = max(i for i in range(cut) if i == 0 or aucs[i] > max(aucs[:i]))
    return cut - 1 - last


def test_min_delta_counts_only_a_clear_gain() -> None:
    watch = ModelWatch(EvalConfig(min_delta=0.01, patience=2))
    assert watch.observe(1, 0.5, {"auc": 0.70, "logloss": 0.5}) is None
    assert watch.observe(2, 0.5, {"auc": 0.705, "logloss": 0.5}) is None  # +0.005: not better
    stop = watch.observe(3, 0.5, {"auc": 0.709, "logloss": 0.5})
    assert stop is not None and stop.kind == "early" and stop.since_best == 2
    assert "0.7000" in stop.why and "eval.patience 2" in stop.why


@pytest.mark.parametrize("loss", [math.nan, math.inf])
def test_a_training_loss_that_is_not_a_number_diverges_even_without_a_holdout(
    loss: float,
) -> None:
    stop = ModelWatch(EvalConfig()).observe(4, loss, None)
    assert stop is not None and stop.kind == "diverged" and stop.passes_done == 4
    assert f"the training loss is {loss}" == stop.why


def test_a_holdout_metric_that_is_not_a_number_diverges() -> None:
    watch = ModelWatch(EvalConfig())
    watch.observe(1, 0.5, {"auc": 0.7, "logloss": 0.5, "ctr": 0.25})
    stop = watch.observe(2, 0.5, {"auc": math.nan, "logloss": math.nan, "ctr": 0.25})
    assert stop is not None and stop.kind == "diverged" and "holdout" in stop.why


def test_a_holdout_of_one_class_is_undefined_not_diverged() -> None:
    # AUC and NE need both classes: a day of no clicks says nothing of the model
    stop = ModelWatch(EvalConfig()).observe(
        1, 0.5, {"auc": math.nan, "logloss": 0.3, "ne": math.nan, "ctr": 0.0, "examples": 9.0}
    )
    assert stop is None


def test_without_best_by_the_last_checkpoint_is_the_model() -> None:
    watch = ModelWatch(EvalConfig(best_by=None))
    watch.observe(1, 0.5, {"auc": 0.8, "logloss": 0.4})
    assert watch.checkpointed("pass-000001", 1, {"auc": 0.8, "logloss": 0.4}) is None


def test_best_is_written_with_every_field_a_reader_needs() -> None:
    # the manifest's "model": model_among reads "checkpoint", the report "passes_done"
    best = Best("pass-000003", "ne", 0.91, 3)
    assert best.to_json() == {
        "checkpoint": "pass-000003",
        "metric": "ne",
        "value": 0.91,
        "passes_done": 3,
    }
    assert str(best) == "pass-000003 (ne 0.9100)"

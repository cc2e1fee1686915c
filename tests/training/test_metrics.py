"""Metrics against plain reference formulas."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from daskhps.training.metrics import auc, evaluate_predictions, logloss, normalized_entropy


def _auc_reference(pred: np.ndarray, label: np.ndarray) -> float:
    """Probability that a random positive outranks a random negative (ties count half)."""
    pos, neg = pred[label == 1], pred[label == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 1.0]), st.integers(0, 1)),
        min_size=2,
        max_size=60,
    )
)
def test_auc_matches_pairwise_reference(rows: list[tuple[float, int]]) -> None:
    pred = np.array([r[0] for r in rows])
    label = np.array([r[1] for r in rows])
    if label.min() == label.max():
        assert np.isnan(auc(pred, label))
        return
    assert auc(pred, label) == pytest.approx(_auc_reference(pred, label), abs=1e-12)


def test_logloss_and_ne() -> None:
    pred = np.array([0.9, 0.2, 0.6, 0.1])
    label = np.array([1, 0, 1, 0])
    ref = -np.mean(np.log([0.9, 0.8, 0.6, 0.9]))
    assert logloss(pred, label) == pytest.approx(ref)
    base = -np.log(0.5)
    assert normalized_entropy(pred, label) == pytest.approx(ref / base)
    # predicting the average CTR gives NE 1
    assert normalized_entropy(np.full(4, 0.5), label) == pytest.approx(1.0)


def test_evaluate_predictions_calibration() -> None:
    pred = np.array([0.5, 0.5, 0.5, 0.5])
    label = np.array([1, 0, 0, 0])
    m = evaluate_predictions(pred, label)
    assert m["calibration"] == pytest.approx(2.0)
    assert m["ctr"] == pytest.approx(0.25)
    assert m["examples"] == 4
    assert set(m) >= {"auc", "logloss", "ne", "calibration"}

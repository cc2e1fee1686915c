"""Evaluation metrics of a CTR model: AUC, logloss, normalized entropy, calibration.

All vectorised over numpy arrays of predicted probabilities and 0/1 labels.
"""

from __future__ import annotations

import numpy as np

from daskhps.errors import DataError

__all__ = ["auc", "evaluate_predictions", "logloss", "normalized_entropy"]

_EPS = 1e-7


def _check(pred: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pred = np.asarray(pred, dtype=np.float64).reshape(-1)
    label = np.asarray(label, dtype=np.float64).reshape(-1)
    if pred.shape != label.shape:
        raise DataError(f"metrics: {pred.size} predictions for {label.size} labels")
    return pred, label


def auc(pred: np.ndarray, label: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties).

    ``nan`` when only one class is present.
    """
    pred, label = _check(pred, label)
    pos = label > 0.5
    n_pos = int(pos.sum())
    n_neg = pred.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(pred, kind="mergesort")
    sorted_pred = pred[order]
    # average rank of each run of tied predictions (1-based)
    starts = np.flatnonzero(np.r_[True, sorted_pred[1:] != sorted_pred[:-1]])
    ends = np.r_[starts[1:], sorted_pred.size]
    avg = (starts + ends + 1) / 2.0
    ranks = np.empty(pred.size)
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(pred: np.ndarray, label: np.ndarray) -> float:
    """Mean binary cross-entropy, predictions clipped to ``[1e-7, 1 - 1e-7]``."""
    pred, label = _check(pred, label)
    if pred.size == 0:
        return float("nan")
    p = np.clip(pred, _EPS, 1 - _EPS)
    return float(-np.mean(label * np.log(p) + (1 - label) * np.log1p(-p)))


def normalized_entropy(pred: np.ndarray, label: np.ndarray) -> float:
    """Logloss divided by the entropy of the empirical click rate (He et al., 2014):
    below 1 means better than always predicting the average CTR."""
    pred, label = _check(pred, label)
    ctr = float(label.mean()) if label.size else float("nan")
    if not 0.0 < ctr < 1.0:
        return float("nan")
    base = -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr))
    return logloss(pred, label) / base


def evaluate_predictions(
    pred: np.ndarray, label: np.ndarray, metrics: tuple[str, ...] | list[str] = ()
) -> dict[str, float]:
    """The requested metrics (``auc``, ``logloss``, ``ne``, ``calibration``), plus counts."""
    pred, label = _check(pred, label)
    wanted = set(metrics or ("auc", "logloss", "ne", "calibration"))
    out: dict[str, float] = {"examples": float(pred.size)}
    ctr = float(label.mean()) if label.size else float("nan")
    if "auc" in wanted:
        out["auc"] = auc(pred, label)
    if "logloss" in wanted:
        out["logloss"] = logloss(pred, label)
    if "ne" in wanted:
        out["ne"] = normalized_entropy(pred, label)
    if "calibration" in wanted:
        out["calibration"] = float(pred.mean()) / ctr if ctr > 0 else float("nan")
    out["ctr"] = ctr
    return out

"""The publish guard: may a candidate replace the published version?

Both models are scored on the same rows of the newest day, which neither was trained on
(progressive validation: each day is first scored, then trained on by the next run). The
candidate passes when every enabled check of :class:`~daskhps.config.retrain.RetrainConfig`
holds; a metric that is not a number (a diverged candidate, a day with one class only) fails.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from daskhps.config.retrain import RetrainConfig

__all__ = ["Verdict", "judge"]


@dataclass(frozen=True)
class Verdict:
    """``publish`` and, either way, one line per check: why it held or failed."""

    publish: bool
    passed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()

    def explain(self) -> str:
        return "; ".join(self.failed if not self.publish else self.passed) or "no checks enabled"


def _num(metrics: Mapping[str, float] | None, key: str) -> float:
    value = (metrics or {}).get(key, float("nan"))
    return float(value) if value is not None else float("nan")


def judge(
    candidate: Mapping[str, float],
    baseline: Mapping[str, float] | None,
    guard: RetrainConfig,
    baseline_name: str = "published version",
) -> Verdict:
    """Apply ``guard`` to the candidate's and the baseline's metrics on the same rows."""
    passed: list[str] = []
    failed: list[str] = []
    auc, loss = _num(candidate, "auc"), _num(candidate, "logloss")
    base_auc, base_loss = _num(baseline, "auc"), _num(baseline, "logloss")

    def check(ok: bool, text: str) -> None:
        (passed if ok else failed).append(text)

    if not math.isfinite(loss):
        check(False, f"candidate logloss is {loss} (diverged or no rows scored)")
    if guard.max_auc_drop is not None:
        if not (math.isfinite(auc) and math.isfinite(base_auc)):
            check(
                False,
                f"AUC undefined (candidate {auc}, {baseline_name} {base_auc}): the scored day "
                "needs both clicks and non-clicks, and a candidate that did not diverge",
            )
        else:
            drop = base_auc - auc
            check(
                drop <= guard.max_auc_drop + 1e-12,
                f"AUC {auc:.5f} vs {baseline_name} {base_auc:.5f}: drop {drop:+.5f} "
                f"{'<=' if drop <= guard.max_auc_drop + 1e-12 else '>'} "
                f"max_auc_drop {guard.max_auc_drop}",
            )
    if guard.max_logloss_rise is not None and math.isfinite(loss):
        if not math.isfinite(base_loss):
            check(True, f"logloss {loss:.5f}; {baseline_name} has none to compare")
        else:
            rise = loss - base_loss
            ok = rise <= guard.max_logloss_rise + 1e-12
            check(
                ok,
                f"logloss {loss:.5f} vs {baseline_name} {base_loss:.5f}: rise {rise:+.5f} "
                f"{'<=' if ok else '>'} max_logloss_rise {guard.max_logloss_rise}",
            )
    if guard.min_auc is not None:
        ok = math.isfinite(auc) and auc >= guard.min_auc
        check(ok, f"AUC {auc:.5f} {'>=' if ok else '<'} min_auc {guard.min_auc}")
    return Verdict(not failed, tuple(passed), tuple(failed))

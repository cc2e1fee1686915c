"""Scheduled retraining: new complete log days in, a guarded, versioned model out.

::

    day=YYYY-MM-DD/_SUCCESS  ->  days.plan_days        which days to train on, which to score
    RetrainLock                  one run per run directory
    candidate                    train from the published version (warm start), score both
    guard.judge                  may the candidate replace the published version?
    versions.Registry            publish atomically (CURRENT), history, rollback

``daskhps retrain CONFIG`` runs :func:`daskhps.retrain.job.retrain` through
``pipelines/retrain.py``; docs/retraining.md describes the whole job.
"""

from __future__ import annotations

from daskhps.retrain.codes import EXIT_CODES_HELP, ExitCode
from daskhps.retrain.days import Day, DayPlan, plan_days, scan_days
from daskhps.retrain.errors import (
    RegistryError,
    RetrainLockedError,
    UnknownVersionError,
    VersionNotFoundError,
)
from daskhps.retrain.guard import Verdict, judge
from daskhps.retrain.lock import RetrainLock
from daskhps.retrain.versions import Attempt, Registry, Version

__all__ = [
    "EXIT_CODES_HELP",
    "Attempt",
    "Day",
    "DayPlan",
    "ExitCode",
    "Registry",
    "RegistryError",
    "RetrainLock",
    "RetrainLockedError",
    "UnknownVersionError",
    "Verdict",
    "Version",
    "VersionNotFoundError",
    "judge",
    "plan_days",
    "scan_days",
]

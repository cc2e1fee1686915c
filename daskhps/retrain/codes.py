"""Exit codes of ``daskhps retrain``: what a scheduler (cron, a systemd timer) can act on."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["EXIT_CODES_HELP", "ExitCode"]


class ExitCode(IntEnum):
    """The process exit status of one retraining run."""

    PUBLISHED = 0  # a new version was published (or a rollback / listing succeeded)
    ERROR = 1  # training, data or the registry failed; nothing was published
    BAD_CONFIG = 2  # the config (or the command line) is invalid; nothing was started
    NOTHING_NEW = 3  # no new complete day since the last run: nothing done
    REJECTED = 4  # a candidate was trained but the guard kept the published version
    LOCKED = 5  # another run of the same run directory is in progress: nothing done


EXIT_CODES_HELP = """exit codes:
  0  published a new version (or rolled back / listed versions)
  1  error (data, training, registry); nothing published
  2  bad config or arguments; nothing started
  3  nothing new: no complete day newer than the last run's
  4  candidate rejected by the guard; the published version stays current
  5  locked: another run of this run directory is in progress"""

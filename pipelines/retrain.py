"""The scheduled retraining job: new complete log days in, a guarded, versioned model out.

A thin composition over :mod:`daskhps.retrain` (docs/retraining.md): take the run's lock, find
the complete days newer than the published version, train a candidate from it on all of them
but the newest, score both on the newest, publish if the guard holds. ``daskhps retrain
CONFIG`` calls :func:`run`; a scheduler (cron, a systemd timer) acts on its exit code.
"""

from __future__ import annotations

import logging
import sys

from daskhps.config import RunConfig
from daskhps.errors import ConfigError, DaskHPSError
from daskhps.monitor.progress import Progress, quiet_run
from daskhps.retrain import ExitCode, RetrainLockedError, UnknownVersionError
from daskhps.retrain.follow import follow as run_follow
from daskhps.retrain.job import describe_versions, retrain, rollback

__all__ = ["run"]

log = logging.getLogger("daskhps.pipelines.retrain")


def _error(message: str) -> None:
    print(f"daskhps retrain: {message}", file=sys.stderr)


def run(
    config: RunConfig,
    *,
    rollback_to: str | None = None,
    list_versions: bool = False,
    dry_run: bool = False,
    follow: bool = False,
    max_chunks: int | None = None,
) -> int:
    """Run the job (or roll back, or list versions); returns the exit code (``ExitCode``)."""
    if config.run.quiet:
        quiet_run()  # no Dask chatter: warnings and errors only
    echo = None if config.run.quiet else (lambda message: print(message, file=sys.stderr))
    try:
        if list_versions:
            print(describe_versions(config))
            return ExitCode.PUBLISHED
        if rollback_to is not None:
            outcome = rollback(config, rollback_to)
        else:
            # no bars (carriage returns) in the log files a scheduler writes
            progress: Progress | None = None  # a bar on a terminal, else a line a pass
            if not sys.stderr.isatty():
                progress = False if config.run.quiet else "lines"
            if follow:
                # a follower's own lines are its log: said whether or not the run is quiet
                outcome = run_follow(
                    config,
                    say=lambda message: print(message, file=sys.stderr, flush=True),
                    echo=echo,
                    progress=progress if progress is not None else False,
                    max_chunks=max_chunks,
                )
            else:
                outcome = retrain(config, echo=echo, progress=progress, dry_run=dry_run)
    except RetrainLockedError as e:
        _error(f"locked: {e}")
        return ExitCode.LOCKED
    except (ConfigError, UnknownVersionError) as e:
        _error(f"error: {e}")
        return ExitCode.BAD_CONFIG
    except (DaskHPSError, OSError) as e:  # OSError: disk full, permission denied
        _error(f"error: {e}")
        return ExitCode.ERROR
    print(outcome.message)
    return outcome.code

"""The training job: the config in, a trained run directory out.

A thin composition over the library: generate or find the click logs, train pass after pass on
the cluster (:class:`daskhps.training.trainer.Trainer`), report. ``daskhps train CONFIG`` calls
:func:`run`; Python code may call it, or :func:`daskhps.train`, directly.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from pathlib import Path

from daskhps.config import RunConfig
from daskhps.data.generation import ceiling_of
from daskhps.monitor.progress import Progress, quiet_run
from daskhps.monitor.report import write_report
from daskhps.training.trainer import RunResult, Trainer

__all__ = ["DIVERGED", "run", "summary_lines", "train"]

DIVERGED = 3  # exit status of a run that diverged (1: a user error, 2: no pipeline)

log = logging.getLogger("daskhps.pipelines.train")


def train(
    config: RunConfig,
    *,
    progress: Progress | None = None,
    resume: bool = False,
    overwrite: bool = False,
    checkpoint: str | None = None,
) -> RunResult:
    """Train as ``config`` says; returns the per-pass records and final evaluation.

    ``resume``: continue the run in ``run.dir`` from its latest checkpoint (or ``checkpoint``);
    ``overwrite``: start over in a ``run.dir`` that holds a run (docs/checkpoints.md).
    """
    if config.run.quiet:
        quiet_run()  # no Dask chatter: warnings and errors only
    echo = None if config.run.quiet else (lambda message: print(message, file=sys.stderr))
    return Trainer(config, progress=progress, echo=echo).run(
        resume=resume, overwrite=overwrite, checkpoint=checkpoint
    )


def _ceiling(config: RunConfig) -> float | None:
    """AUC of the true generating function of synthetic logs, when there is one."""
    gen = config.data.generate
    if gen is None:
        return None
    return ceiling_of(gen.out)


def _import_plotting_meanwhile() -> threading.Thread:
    """Import what the report draws with on a thread while the run trains: about a second
    of the driver's, which then mostly waits on the workers; the report at the end no
    longer pays for it. A failed import is the report's to say (:func:`_report`)."""

    def imports() -> None:
        with contextlib.suppress(Exception):
            import matplotlib.backends.backend_agg
            import matplotlib.figure  # noqa: F401

    thread = threading.Thread(target=imports, name="daskhps-plotting-import", daemon=True)
    thread.start()
    return thread


def _report(result: RunResult, ceiling: float | None) -> Path | None:
    """Write the run report (docs/monitoring.md); failing to draw it never fails the run."""
    if not result.passes:
        return None
    try:
        return write_report(result.run_dir, ceiling_auc=ceiling)
    except Exception as e:  # a plotting problem must not lose a trained model's exit code
        log.warning("could not write the run report of %s: %s", result.run_dir, e)
        return None


def run(
    config: RunConfig, resume: bool = False, overwrite: bool = False, checkpoint: str | None = None
) -> int:
    """Run the job; returns the process exit code."""
    # Bars redraw one line with carriage returns: in a log file that is one endless line, so
    # there a line per pass instead (none when quiet)
    progress: Progress | None = None
    if not sys.stderr.isatty():
        progress = False if config.run.quiet else "lines"
    plotting = _import_plotting_meanwhile()
    result = train(
        config, progress=progress, resume=resume, overwrite=overwrite, checkpoint=checkpoint
    )
    plotting.join()
    if result.complete is not None:  # nothing trained: nothing to report or rewrite
        print(result.complete, file=sys.stderr)
        return 0
    ceiling = _ceiling(config)
    report = _report(result, ceiling)
    print("\n".join(summary_lines(result, ceiling, report)))
    stopped = result.stopped or {}
    if stopped.get("kind") == "diverged":
        print(f"daskhps train: error: {stopped['line']}", file=sys.stderr)
        return DIVERGED
    return 0


def summary_lines(result: RunResult, ceiling: float | None, report: Path | None) -> list[str]:
    """What ``daskhps train`` prints at the end: the run's model and its holdout first."""
    lines = [f"run directory: {result.run_dir}"]
    if result.passes:
        lines.append(
            f"passes: {len(result.passes)}, final train loss {result.passes[-1]['train_loss']:.4f}"
        )
    stopped = result.stopped or {}
    if stopped.get("kind") == "early":
        lines.append(f"stopped early after pass {stopped['passes_done']}: {stopped['why']}")
    elif stopped.get("kind") == "diverged":
        lines.append(f"diverged at pass {stopped['passes_done']}: {stopped['why']}")
    model, shown = result.model or {}, result.model_eval
    if model:
        lines.append(
            f"model: {model['checkpoint']} (best holdout {model['metric']}, of pass "
            f"{model['passes_done']})"
        )
    if shown:
        lines.append("holdout: " + _metrics(shown))
    if model and result.final_eval and result.final_eval != shown:
        lines.append("holdout of the last pass: " + _metrics(result.final_eval))
    ne = shown.get("ne")
    if ne is not None and ne >= 1.0:
        lines.append(
            f"warning: the model predicts worse than the holdout's average click rate would "
            f"(NE {ne:.4f} >= 1): lower the learning rates, or admit keys only after a few "
            "sightings (table.admission.min_count)"
        )
    if ceiling is not None:
        lines.append(f"ceiling AUC of the generating function: {ceiling:.4f}")
    if report is not None:
        lines.append(f"report: {report}")
    return lines


def _metrics(evaluation: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in evaluation.items() if k != "examples")

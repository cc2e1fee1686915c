"""``daskhps train``: load and validate a run config from the command line, then hand it to
the training pipeline (``pipelines/train.py``)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import shlex
import sys
import time

from daskhps import _forkserver as forkserver
from daskhps.config.arguments import add_config_arguments
from daskhps.config.runconfig import load_config

__all__ = ["PIPELINE", "add_train_arguments", "run_train", "train_interrupted"]

PIPELINE = "pipelines.train"
NO_PIPELINE = 2  # exit status when the pipeline is not installed (1 is a user error)


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in run.dir from its latest complete checkpoint",
    )
    p.add_argument(
        "--checkpoint",
        metavar="NAME",
        help="with --resume: continue from this checkpoint (e.g. pass-000003) instead of the "
        "latest; discarding later ones needs --overwrite",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in a run.dir that holds a run: the earlier run is kept aside and "
        "deleted once the new run's first checkpoint is complete (put back if it fails first)",
    )


def run_train(args: argparse.Namespace) -> int:
    """Validate the config, then run ``pipelines.train.run(config[, resume=...])``."""
    args.started = time.time()  # Ctrl-C: which checkpoints this run wrote (train_interrupted)
    config = load_config(args.config, args.overrides)
    forkserver.warm_up_for(config.cluster)  # the workers' imports, while the run gets ready
    # find_spec, not a guarded import: an ImportError raised inside the pipeline is a bug
    # to show, not a missing pipeline.
    if importlib.util.find_spec("pipelines") is None or importlib.util.find_spec(PIPELINE) is None:
        print(
            "daskhps train: error: training pipeline not available (pipelines/train.py is "
            f"not installed); the config {args.config} is valid",
            file=sys.stderr,
        )
        return NO_PIPELINE
    run = importlib.import_module(PIPELINE).run
    wanted = {"resume": args.resume, "overwrite": args.overwrite, "checkpoint": args.checkpoint}
    accepted = inspect.signature(run).parameters
    lacking = [k for k, v in wanted.items() if v and k not in accepted]
    if lacking:
        flags = ", ".join(f"--{k}" for k in lacking)
        print(f"daskhps train: error: this training pipeline cannot {flags}", file=sys.stderr)
        return NO_PIPELINE
    result = run(config, **{k: v for k, v in wanted.items() if k in accepted})
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def train_interrupted(args: argparse.Namespace) -> str:
    """The line Ctrl-C during ``daskhps train`` ends with: how far the run's checkpoints got
    and the command that resumes it (or that nothing was checkpointed)."""
    # Here, not at the top: runfiles.checkpoint loads torch, which `daskhps config` and a
    # train that fails its config check never need.
    from daskhps.runfiles.checkpoint import MANIFEST, latest_checkpoint

    command = ["daskhps", "train", args.config]
    for override in args.overrides:
        command += ["--set", override]
    try:
        config = load_config(args.config, args.overrides)
        ckpt = latest_checkpoint(config.run.dir)
    except Exception:  # interrupted while the config loaded: nothing ran yet
        return "interrupted before the run started"
    if ckpt is None:
        why = "" if config.checkpoint.enabled else " (checkpoint.every_passes is 0)"
        return (
            f"interrupted: nothing was checkpointed{why}; start again with: {shlex.join(command)}"
        )
    written = (ckpt.path / MANIFEST).stat().st_mtime >= getattr(args, "started", 0.0)
    if getattr(args, "overwrite", False) and not getattr(args, "resume", False) and not written:
        # the new run wrote no checkpoint: the run it was replacing was put back
        return (
            f"interrupted before the new run's first checkpoint: the earlier run in "
            f"{config.run.dir} is back as it was (last checkpoint {ckpt.name}); start over "
            f"again with: {shlex.join([*command, '--overwrite'])}"
        )
    return (
        f"interrupted: the run's last checkpoint is after pass {ckpt.passes_done} ({ckpt.path}); "
        f"resume with: {shlex.join([*command, '--resume'])}"
    )

"""daskhps: a hierarchical parameter server on Dask for CTR models with huge embedding tables."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from daskhps._version import __version__
from daskhps.errors import DaskHPSError

if TYPE_CHECKING:
    from daskhps.config import RunConfig
    from daskhps.training.trainer import RunResult

__all__ = ["DaskHPSError", "__version__", "train"]


def train(
    config: RunConfig | str | Path,
    overrides: tuple[str, ...] = (),
    *,
    resume: bool = False,
    overwrite: bool = False,
    checkpoint: str | None = None,
    **kw: Any,
) -> RunResult:
    """Train from a :class:`~daskhps.config.RunConfig` or a YAML file (with ``--set``-style
    ``overrides``); the same job, and the same run-directory rules, as ``daskhps train CONFIG
    [--resume] [--overwrite] [--checkpoint NAME]``. Other keywords go to
    :class:`~daskhps.training.trainer.Trainer` (``progress``, ``echo``)."""
    # Imported on call: ``import daskhps`` (the CLI's first line, every worker's unpickling)
    # must not load torch, dask and the trainer.
    from daskhps.config import RunConfig, load_config
    from daskhps.training.trainer import Trainer

    cfg = config if isinstance(config, RunConfig) else load_config(config, overrides)
    return Trainer(cfg, **kw).run(resume=resume, overwrite=overwrite, checkpoint=checkpoint)

"""Terminal output of a run: quiet mode for scheduled runs.

Progress bars (tqdm) are drawn by the generator and the trainer unless the run is quiet; see
``Trainer(progress=...)`` and ``GenerateConfig.ensure(progress=...)``.
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["quiet_run"]


def quiet_run() -> None:
    """Make this process quiet for a scheduled run: only warnings and errors of daskhps, and
    errors of Dask, reach the terminal (progress bars are the caller's to turn off).

    Dask's INFO and WARNING chatter (workers starting, a garbage-collection note) goes; the
    notice that the dashboard's port was taken goes too (the dashboard simply moves to a free
    port, see docs/monitoring.md); other Python warnings are logged as WARNING lines.
    """
    logging.getLogger("distributed").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r"Port \d+ is already in use", category=UserWarning)
    logging.captureWarnings(True)

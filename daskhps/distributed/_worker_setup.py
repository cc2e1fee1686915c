"""The worker plugin every cluster of a run gets first: how its workers report.

* ``Compute Failed`` blocks of errors daskhps raises on purpose are dropped
  (:mod:`daskhps.distributed._expected`): the driver prints them as one line.
"""

from __future__ import annotations

from typing import Any

from distributed import WorkerPlugin

from daskhps.distributed._expected import quiet_expected_errors

__all__ = ["PLUGIN_NAME", "WorkerSetup", "setup_workers"]

PLUGIN_NAME = "daskhps-worker-setup"


class WorkerSetup(WorkerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def setup(self, worker: Any) -> None:
        quiet_expected_errors()


def setup_workers(client: Any) -> None:
    """Register :class:`WorkerSetup` on every worker, now and joining later; this process's
    own worker logger (in-process workers, the driver) is quieted too."""
    quiet_expected_errors()
    client.register_plugin(WorkerSetup(), name=PLUGIN_NAME)

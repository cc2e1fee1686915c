"""A run's hold on its workers dies with its driver.

::

    driver: RunGroup.start ─► register RunLease(client.id, token) on the scheduler
                          ─► register RunHost(token) on the workers (stores opened, locked)
    driver killed ─► its connection closes ─► scheduler: remove_client(client.id)
        ─► RunLease: unregister the worker plugin daskhps-run-<token>
        ─► every worker: RunHost.teardown: a running pass stops at its next batch, the
           process group is dropped, the shards close without their uncommitted rows (the
           run resumes from its last checkpoint), the store locks are released

Without it, ``dask worker`` processes that outlive their driver (any cluster but the
embedded one, which dies with the driver) keep the killed run's stores open and locked, and
``--resume`` waits for locks nobody will release. The scheduler's word that the client left
is the lease: no renewal thread on the driver, and nothing on the workers polls.

The scheduler unpickles the plugin, so it needs daskhps installed (as the workers do); a
scheduler that cannot load it is a warning, not a failure: the run trains, and a killed
driver's workers then hold its stores until they restart.
"""

from __future__ import annotations

import logging
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from daskhps.errors import first_line

__all__ = ["RunLease", "hold", "release"]

log = logging.getLogger(__name__)

_PREFIX = "daskhps-lease-"


class RunLease(SchedulerPlugin):
    """On the scheduler: when client ``client_id`` leaves, every worker drops the run's
    worker plugin ``plugin`` (and this lease goes)."""

    idempotent = False

    def __init__(self, client_id: str, token: str, plugin: str) -> None:
        self.client_id = client_id
        self.token = token
        self.plugin = plugin
        self.name = _PREFIX + token

    def remove_client(self, scheduler: Any, client: str) -> None:
        if client != self.client_id:
            return
        log.warning(
            "the driver of daskhps run %s left (client %s): its workers release the run",
            *(self.token, client),
        )
        # the scheduler's own task group keeps the task (and cancels it when it closes)
        scheduler._ongoing_background_tasks.call_soon(self._release, scheduler)

    async def _release(self, scheduler: Any) -> None:
        try:
            if self.plugin in scheduler.worker_plugins:
                await scheduler.unregister_worker_plugin(None, self.plugin)
        except Exception as e:  # a worker that is gone has nothing to release
            log.warning("releasing run %s on its workers: %s", self.token, e)
        scheduler.remove_plugin(name=self.name)


def hold(client: Any, token: str, plugin: str) -> bool:
    """Register the lease of run ``token`` (worker plugin ``plugin``) for ``client``; False,
    with a warning, when the scheduler cannot take it."""
    try:
        client.register_plugin(RunLease(client.id, token, plugin), name=_PREFIX + token)
    except Exception as e:
        log.warning(
            "the scheduler did not take the run's lease (%s): if this driver is killed, its "
            "workers keep the run's stores until they restart; install daskhps where the "
            "scheduler runs",
            first_line(e),
        )
        return False
    return True


def release(client: Any, token: str) -> None:
    """Drop the lease of run ``token`` (the run closed its workers itself). Never raises."""
    try:
        client.unregister_scheduler_plugin(_PREFIX + token)
    except Exception as e:
        log.debug("dropping the lease of run %s: %s", token, e)

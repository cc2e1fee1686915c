r"""How the ranks of a run form their process group through Dask, once per run.

::

    client                      worker 0 (rank 0)               worker r (rank r)
    ------                      -----------------               -----------------
    serve_store on rank 0 --->  TCPStore server on a free port
                        <-----  port                            (kept by rank 0's RunHost)
    join on every rank at once (gang scheduled, pinned):
                                ProcessGroupGloo(store, 0, W)   ProcessGroupGloo(store, r, W)
                                     \_________ rendezvous, <= timeout_s _________/
                                host.comm                       host.comm
    later tasks: every rank's host.comm runs collectives worker to worker.

``init_method="file"`` uses a FileStore under a run directory instead of the TCP store (one
machine, or a shared file system). A rank that does not join surfaces as :class:`CommError`
(the rendezvous timed out after ``timeout_s``) or :class:`WorkerLostError` (its worker left
the cluster), never as a hang.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as dist

from daskhps.distributed._errors import CommError
from daskhps.distributed.collective import Comm

if TYPE_CHECKING:
    from daskhps.distributed.host import RunGroup, RunHost

__all__ = ["form_group"]

log = logging.getLogger(__name__)


def form_group(
    group: RunGroup,
    *,
    backend: str | None = None,
    device: str = "cpu",
    timeout_s: float = 60.0,
    init_method: str = "tcp",
    run_dir: str | Path | None = None,
) -> str:
    """Give every rank of ``group`` its :class:`Comm`; returns the backend they use.

    ``init_method`` is ``"tcp"`` (rank 0's worker serves a TCP store on a free port) or
    ``"file"`` (a FileStore under ``run_dir``: one machine or a shared file system).
    """
    world = group.world_size
    if init_method == "tcp":
        if world > 1:
            port = group.run(_serve_store, world, timeout_s, what="serve store", ranks=[0])[0]
            method = f"tcp://{_host_of(group.addresses[0])}:{port}"
        else:
            method = "tcp://127.0.0.1:0"  # unused: one rank needs no store
    elif init_method == "file":
        if run_dir is None:
            raise CommError("init_method='file' needs run_dir (a directory every worker sees)")
        path = Path(run_dir) / "comm" / group.token
        path.parent.mkdir(parents=True, exist_ok=True)
        method = f"file://{path}"
    else:
        raise CommError(f"init_method {init_method!r} must be 'tcp' or 'file'")
    backends = group.run(
        _join,
        world,
        method,
        backend,
        device,
        timeout_s,
        what="process group rendezvous",
        timeout_s=timeout_s + 10.0,  # the ranks' own timeout fires first
    )
    log.info("process group %s: %d ranks, %s, %s", group.token, world, backends[0], method)
    return str(backends[0])


def _serve_store(host: RunHost, world: int, timeout_s: float) -> int:
    """Rank 0: start the TCP store on a free port (chosen by the OS, so no race)."""
    host.rendezvous_store = dist.TCPStore(
        "0.0.0.0",
        0,
        world,
        True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    return int(host.rendezvous_store.port)


def _join(
    host: RunHost,
    world: int,
    init_method: str,
    backend: str | None,
    device: str,
    timeout_s: float,
) -> str:
    rank = host.require_rank()
    store = None
    if init_method.startswith("tcp://") and world > 1:  # one rank needs no store
        store = host.rendezvous_store if rank == 0 else None
        if store is None:
            address, _, port = init_method[len("tcp://") :].rpartition(":")
            store = dist.TCPStore(
                address, int(port), world, False, timeout=timedelta(seconds=timeout_s)
            )
    host.comm = Comm.create(
        rank,
        world,
        init_method=init_method,
        store=store,
        backend=backend,
        device=device,
        timeout_s=timeout_s,
        group_name=host.token,
    )
    return host.comm.backend


def _host_of(address: str) -> str:
    """Host of a worker address; in-process workers (``inproc://``) are on this machine."""
    from distributed.comm import get_address_host

    if address.startswith("inproc://"):
        return "127.0.0.1"
    return str(get_address_host(address))

"""One host per run on each worker, and the client's handle that runs functions on every rank.

::

    client: RunGroup.start(client, addresses, shards=WorkerShards(...))
      register RunHost(token) ──► every worker: setup: rank = addresses.index(worker.address)
      form the process group  ──► every rank:   host.comm (daskhps.distributed.rendezvous)
      open the shards         ──► every rank:   host.shards.open()

    group.run(fn, *args, rank_args=)   every rank at once: fn(host, *args, *rank_args[r])
    group.on_shards(Method, *args)     every rank at once: Method(host.shards, *args)
    group.close_shards(); group.close()  close the stores, drop the group, unregister

A :class:`RunHost` holds everything of one run that lives on a worker between tasks: the
rank, the process group (:class:`~daskhps.distributed.collective.Comm`), the table shards
(:class:`~daskhps.distributed.shards.WorkerShards`) and the dense model replica the
training code keeps in :attr:`RunHost.replica`. It is a Dask worker plugin named after the
run, so runs sharing a cluster (tests, retraining in one process) never see each other's
state, and with ``processes=False`` each in-process worker has its own copy. Every
function ``fn`` the client runs gets the host as its first argument: there is one trampoline
(:func:`_on_host`), not one per operation.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from distributed import WorkerPlugin

from daskhps.distributed import lease
from daskhps.distributed._errors import ClusterError, CommError, required_rank
from daskhps.distributed._pinned import missing_workers, run_pinned
from daskhps.distributed.collective import Comm
from daskhps.distributed.rendezvous import form_group
from daskhps.distributed.shards import WorkerShards
from daskhps.monitor import ShardMetrics
from daskhps.monitor.network import forget_routed
from daskhps.stages import stage_span

__all__ = ["RunGroup", "RunHost", "local_host"]

log = logging.getLogger(__name__)

_PREFIX = "daskhps-run-"


class RunHost(WorkerPlugin):
    """What one run keeps on one worker (see the module docstring).

    Parameters
    ----------
    token:
        The run's token; the plugin's name is ``daskhps-run-<token>``.
    addresses:
        Worker addresses in rank order; a worker outside the list holds nothing.
    shards:
        The run's table shards, or None for a run without tables (a bare process group).
    """

    idempotent = False

    def __init__(
        self, token: str, addresses: Sequence[str], shards: WorkerShards | None = None
    ) -> None:
        self.token = token
        self.name = _PREFIX + token
        self.addresses = tuple(addresses)
        self.shards = shards
        self.rank: int | None = None
        self.comm: Comm | None = None
        self.rendezvous_store: Any = None  # rank 0 serves the TCP store: kept with the group
        self.replica: Any = None  # the dense model replica (daskhps.training.worker)
        self.closing = False  # the run let go of this worker: a running pass stops

    # -- plugin hooks (event loop: keep them light; opening runs in a task) -------------

    def setup(self, worker: Any) -> None:
        addr = str(worker.address)
        self.rank = self.addresses.index(addr) if addr in self.addresses else None
        if self.rank is None:
            log.warning("worker %s is not one of the run's ranks: it holds nothing", addr)
        if self.shards is not None:
            self.shards.bind(self.rank, worker.memory_manager.memory_limit or None)
            self.shards.monitor = ShardMetrics(self.shards, addr)
            self.shards.monitor.register(worker)

    def teardown(self, worker: Any) -> Awaitable[None] | None:
        self.closing = True
        if self.monitor is not None:
            self.monitor.unregister(worker)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # called outside a worker's event loop: close here and now
            self.close()
            return None
        # On the worker's event loop (which awaits what this returns): close in a thread, as
        # closing waits for a running task to let go of the table (a driver that died
        # mid-pass: the pass stops at its next batch).
        return asyncio.to_thread(self.close)

    def close(self) -> None:
        """Close the shards (warning about uncommitted rows), drop the group. Safe twice."""
        if self.shards is not None:
            self.shards.close()
        forget_routed(self.token)  # network figures of passes that never trained
        comm, self.comm, self.rendezvous_store = self.comm, None, None
        self.replica = None
        if comm is not None:
            comm.close()

    @property
    def monitor(self) -> ShardMetrics | None:
        """The shards' figures for the dashboard and ``/metrics`` (set up with the plugin)."""
        return self.shards.monitor if self.shards is not None else None

    # -- what tasks read -------------------------------------------------------------------

    def require_rank(self) -> int:
        return required_rank(self.rank)

    def require_comm(self) -> Comm:
        if self.comm is None:
            raise CommError(
                f"run {self.token} has no process group on rank {self.rank}: run the task "
                "after RunGroup.start and before RunGroup.close"
            )
        return self.comm

    def check_open(self) -> None:
        """Raise :class:`ClusterError` once the run let go of this worker (its driver left):
        long tasks call it between batches."""
        if self.closing:
            raise ClusterError(f"run {self.token} was closed on this worker (its driver left)")

    def require_shards(self) -> WorkerShards:
        if self.shards is None:
            raise ClusterError(f"run {self.token} holds no table shards")
        return self.shards


def local_host(token: str) -> RunHost:
    """This worker's :class:`RunHost` of the run ``token`` (call it inside a Dask task)."""
    from distributed import get_worker

    worker = get_worker()
    host = worker.plugins.get(_PREFIX + token)
    if not isinstance(host, RunHost):
        raise ClusterError(
            f"worker {worker.address} has no host of run {token}: run the task on one of the "
            "run's workers (pinned), after RunGroup.start and before RunGroup.close"
        )
    return host


def _on_host(
    token: str,
    stage: str | None,
    on: Literal["host", "shards"],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *rank_args: Any,
) -> Any:
    """The one task function: ``fn(host, *args, *rank_args)`` (or ``host.shards``), metered
    as ``stage`` on the Fine Performance Metrics page when one is given. The rank's own
    arguments come last and stay top-level task arguments, so Dask hands futures among them
    over as their values, on the worker that holds them."""
    host = local_host(token)
    target = host if on == "host" else host.require_shards()
    if stage is None:
        return fn(target, *args, *rank_args)
    with stage_span(stage):
        return fn(target, *args, *rank_args)


class RunGroup:
    """The client's handle on a run's hosts: ``addresses[r]`` is rank ``r``'s worker.

    Start it with :meth:`start`; use it as a context manager, or call :meth:`close`, so every
    worker drops the run's state.
    """

    def __init__(self, client: Any, addresses: Sequence[str], token: str, timeout_s: float) -> None:
        self.client = client
        self.addresses = tuple(addresses)
        self.token = token
        self.timeout_s = timeout_s
        self.backend = ""
        self.has_shards = False

    @classmethod
    def start(
        cls,
        client: Any,
        addresses: Sequence[str] | None = None,
        *,
        shards: WorkerShards | None = None,
        backend: str | None = None,
        device: str = "cpu",
        timeout_s: float = 60.0,
        init_method: str = "tcp",
        run_dir: str | Path | None = None,
    ) -> RunGroup:
        """Register a :class:`RunHost` on the workers ``addresses`` (rank order; default:
        every worker, sorted by address), form the process group over them and open
        ``shards`` on every rank.

        Raises :class:`CommError` / :class:`WorkerLostError` when a rank does not join within
        ``timeout_s`` (see :mod:`daskhps.distributed.rendezvous`).
        """
        from daskhps.passes.owners import worker_addresses

        addrs = list(addresses) if addresses is not None else worker_addresses(client)
        if not addrs:
            raise CommError("the cluster has no workers: start some before forming the group")
        token = uuid.uuid4().hex[:12]
        group = cls(client, addrs, token, timeout_s)
        lease.hold(client, token, _PREFIX + token)  # a killed driver's workers let go
        client.register_plugin(RunHost(token, addrs, shards), name=_PREFIX + token)
        try:
            group.backend = form_group(
                group,
                backend=backend,
                device=device,
                timeout_s=timeout_s,
                init_method=init_method,
                run_dir=run_dir,
            )
            if shards is not None:
                group.has_shards = True
                group.on_shards(WorkerShards.open, what="open shards")
        except BaseException:
            group.close()
            raise
        return group

    @property
    def world_size(self) -> int:
        return len(self.addresses)

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        rank_args: Sequence[Sequence[Any]] | None = None,
        what: str | None = None,
        stage: str | None = None,
        timeout_s: float | None = None,
        ranks: Sequence[int] | None = None,
    ) -> list[Any]:
        """Run ``fn(host, *args, *rank_args[r])`` on every rank at once (or on ``ranks``
        only); results in rank order. ``fn`` may run collectives; arguments may be futures
        living on that worker. ``stage`` meters the tasks as that stage."""
        return self._run("host", fn, args, rank_args, what, stage, timeout_s, ranks)

    def on_shards(
        self,
        fn: Callable[..., Any],
        *args: Any,
        rank_args: Sequence[Sequence[Any]] | None = None,
        what: str | None = None,
    ) -> list[Any]:
        """:meth:`run` of ``fn(host.shards, *args, *rank_args[r])``: a
        :class:`WorkerShards` method such as ``WorkerShards.commit``."""
        return self._run("shards", fn, args, rank_args, what, None, None, None)

    def _run(
        self,
        on: Literal["host", "shards"],
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        rank_args: Sequence[Sequence[Any]] | None,
        what: str | None,
        stage: str | None,
        timeout_s: float | None,
        ranks: Sequence[int] | None,
    ) -> list[Any]:
        chosen = list(range(self.world_size)) if ranks is None else list(ranks)
        per_rank = [
            (self.token, stage, on, fn, args, *(rank_args[r] if rank_args is not None else ()))
            for r in chosen
        ]
        return run_pinned(
            self.client,
            [self.addresses[r] for r in chosen],
            _on_host,
            rank_args=per_rank,
            what=what or str(getattr(fn, "__name__", "collective task")),
            timeout_s=timeout_s,
        )

    def close_shards(self, uncommitted: Literal["warn", "drop"] = "warn") -> None:
        """Close every rank's shards (releasing the stores' locks). ``uncommitted="drop"``:
        rows changed since the last commit go without a warning (a run that stopped, to
        resume from its last checkpoint)."""
        if self.has_shards:
            self.on_shards(WorkerShards.close, uncommitted, what="close shards")

    def close(self) -> None:
        """Every reachable worker drops the run's host: its process group (rank 0 also stops
        the store) and whatever shards are still open. Never raises."""
        try:
            # A lost worker's address would cost a connect timeout: skip it.
            lost = set(missing_workers(self.client, self.addresses))
            if len(lost) < self.world_size:
                self.client.unregister_worker_plugin(_PREFIX + self.token)
        except Exception as e:  # the reachable workers closed anyway
            log.warning("closing run %s on the workers: %s", self.token, e)
        lease.release(self.client, self.token)

    def __enter__(self) -> RunGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunGroup(world_size={self.world_size}, backend={self.backend!r})"

r"""torch.distributed across Dask workers: one explicit process group per run.

Each rank holds a :class:`Comm`, a plain object around an explicit ``ProcessGroup`` (gloo on
CPU, nccl on CUDA). The default group of ``init_process_group`` is deliberately not used:

* a Dask worker may be a thread of the client process (``processes=False``), and one process
  cannot host several ranks of the default group, but it can host several explicit groups;
* there is no process-global state to leak between runs (tests, retraining in one process).

Bootstrap through Dask (:func:`init_comm`), once per run::

    client                      worker 0 (rank 0)               worker r (rank r)
    ------                      -----------------               -----------------
    submit serve_store  ----->  TCPStore server on a free port
                        <-----  port
    submit join(r) to every worker at once (gang scheduled, pinned):
                                ProcessGroupGloo(store, 0, W)   ProcessGroupGloo(store, r, W)
                                     \_________ rendezvous, <= timeout_s _________/
    later tasks: local_comm(token) gives the rank's Comm; collectives run worker to worker.
    close(): every worker drops its group; rank 0 stops the store.

``init_method="file"`` uses a FileStore under a run directory instead of the TCP store (one
machine, or a shared file system). A lost worker surfaces as :class:`CommError` (a collective
or the rendezvous failed or timed out after ``timeout_s``) or :class:`WorkerLostError` (its
worker left the cluster), never as a hang.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from daskhps.distributed._errors import CommError
from daskhps.distributed._pinned import missing_workers, run_pinned
from daskhps.monitor import stage_span

__all__ = ["Comm", "CommGroup", "init_comm", "local_comm"]

log = logging.getLogger(__name__)


class Comm:
    """One rank's handle on an explicit process group (or on nothing, for one rank).

    Build it with :meth:`create`. Collectives block and raise :class:`CommError` when a peer
    fails or stalls past ``timeout_s``. One thread per rank may issue collectives: every rank
    must call them in the same order.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        backend: str,
        device: torch.device,
        timeout_s: float,
        pg: Any = None,
        store: Any = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.device = device
        self.timeout_s = timeout_s
        self.pg = pg
        self._store = store  # rank 0 serves the TCP store: keep it alive with the group

    @classmethod
    def create(
        cls,
        rank: int,
        world_size: int,
        *,
        init_method: str | None = None,
        store: Any = None,
        backend: str | None = None,
        device: str | torch.device = "cpu",
        timeout_s: float = 60.0,
        group_name: str = "daskhps",
    ) -> Comm:
        """Join a group of ``world_size`` ranks.

        Parameters
        ----------
        init_method:
            ``"tcp://host:port"`` (rank 0 serves the store there) or ``"file:///path"``;
            ignored when ``store`` is given or ``world_size == 1``.
        store:
            A ready ``torch.distributed.Store`` (the Dask bootstrap passes one).
        backend:
            ``"gloo"`` or ``"nccl"``; default: nccl for a CUDA device, else gloo.
        timeout_s:
            Rendezvous and collective timeout: a lost peer fails the call after this long.
        """
        dev = torch.device(device)
        backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
        if not 0 <= rank < world_size:
            raise CommError(f"rank {rank} is not in [0, {world_size}): check the rank order")
        if world_size == 1:
            return cls(0, 1, backend, dev, timeout_s)
        timeout = timedelta(seconds=timeout_s)
        where = f"rank {rank} of {world_size} ({backend}, {init_method or 'given store'})"
        try:
            if store is None:
                store = _make_store(init_method, rank, world_size, timeout)
            prefixed = dist.PrefixStore(group_name, store)
            pg = _make_group(backend, prefixed, rank, world_size, timeout, dev)
        except CommError:
            raise
        except Exception as e:  # rendezvous timeout, refused connection, bad backend
            raise CommError(
                f"{where}: could not form the process group within {timeout_s:g} s: {e}; "
                "a rank did not join (its worker is lost, busy or unreachable): check that "
                "every worker is alive and has a free thread, or raise the timeout"
            ) from e
        return cls(rank, world_size, backend, dev, timeout_s, pg, store)

    # -- collectives -------------------------------------------------------------------

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
    ) -> None:
        """Rows ``input[splits[j]]`` go to rank ``j``; rank ``i``'s rows land in
        ``output[out_splits[i]]`` (uneven and empty splits allowed)."""
        if self.pg is None:
            output.copy_(input)
            return
        opts = dist.AllToAllOptions()
        self._wait(
            "all_to_all_single",
            lambda: self.pg.alltoall_base(
                output, input, list(output_split_sizes), list(input_split_sizes), opts
            ),
        )

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` across ranks, in place."""
        if self.pg is None:
            return
        opts = dist.AllreduceOptions()  # reduceOp defaults to SUM
        self._wait("all_reduce", lambda: self.pg.allreduce([tensor], opts))

    def barrier(self) -> None:
        """Return once every rank has called it (an all-reduce of one element)."""
        self.all_reduce(torch.zeros(1, device=self.device))

    def close(self) -> None:
        """Drop the group (and, on rank 0, the store). Safe to call twice."""
        pg, self.pg, self._store = self.pg, None, None
        if pg is not None and hasattr(pg, "shutdown"):
            try:
                pg.shutdown()
            except Exception as e:  # a broken group may refuse; dropping it is enough
                log.debug("rank %d: process group shutdown: %s", self.rank, e)

    def _wait(self, op: str, start: Callable[[], Any]) -> None:
        try:
            start().wait()
        except Exception as e:  # gloo: peer closed the connection, or timed out
            raise CommError(
                f"rank {self.rank} of {self.world_size}: {op} failed: {e}; a peer rank was "
                f"lost (its worker died) or stalled for more than {self.timeout_s:g} s "
                "(cluster.dist_timeout_s: raise it where one rank's work between collectives, "
                "such as staging from a store the page cache cannot hold, can take longer): "
                "the run cannot continue, resume it with --resume"
            ) from e

    def __repr__(self) -> str:
        return f"Comm(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r})"


def _make_store(init_method: str | None, rank: int, world: int, timeout: timedelta) -> Any:
    if init_method is None:
        raise CommError("world_size > 1 needs an init_method ('tcp://host:port' or 'file://')")
    if init_method.startswith("tcp://"):
        host, _, port = init_method[len("tcp://") :].rpartition(":")
        return dist.TCPStore(host, int(port), world, rank == 0, timeout=timeout)
    if init_method.startswith("file://"):
        return dist.FileStore(init_method[len("file://") :], world)
    raise CommError(f"init_method {init_method!r} must start with 'tcp://' or 'file://'")


def _make_group(
    backend: str, store: Any, rank: int, world: int, timeout: timedelta, device: torch.device
) -> Any:
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world, timeout)
    if backend == "nccl":
        if not (dist.is_nccl_available() and device.type == "cuda"):
            raise CommError(
                f"backend 'nccl' needs a CUDA device and a CUDA build of torch (device "
                f"{device}): use backend 'gloo' or run on GPU workers"
            )
        torch.cuda.set_device(device)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world, opts)
    raise CommError(f"backend {backend!r} is not one of 'gloo', 'nccl'")


# -- the Dask side ---------------------------------------------------------------------

# Worker-local registry: (token, worker address) -> Comm. Keyed by address too because with
# processes=False every worker of the cluster shares this module.
_COMMS: dict[tuple[str, str], Comm] = {}
_STORES: dict[str, Any] = {}
_LOCK = threading.Lock()


def _worker_address() -> str:
    from distributed import get_worker

    return str(get_worker().address)


def local_comm(token: str) -> Comm:
    """This worker's :class:`Comm` of the group ``token`` (call it inside a Dask task)."""
    key = (token, _worker_address())
    with _LOCK:
        comm = _COMMS.get(key)
    if comm is None:
        raise CommError(
            f"no process group {token!r} on worker {key[1]}: run the task on one of the "
            "group's workers (pinned), after init_comm and before CommGroup.close"
        )
    return comm


def _serve_store(token: str, world: int, timeout_s: float) -> int:
    """Rank 0: start the TCP store on a free port (chosen by the OS, so no race)."""
    store = dist.TCPStore(
        "0.0.0.0",
        0,
        world,
        True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    with _LOCK:
        _STORES[token] = store
    return int(store.port)


def _join(
    rank: int,
    token: str,
    world: int,
    init_method: str,
    backend: str | None,
    device: str,
    timeout_s: float,
) -> str:
    store = None
    if init_method.startswith("tcp://") and world > 1:  # one rank needs no store
        with _LOCK:
            store = _STORES.get(token) if rank == 0 else None
        if store is None:
            host, _, port = init_method[len("tcp://") :].rpartition(":")
            store = dist.TCPStore(
                host, int(port), world, False, timeout=timedelta(seconds=timeout_s)
            )
    comm = Comm.create(
        rank,
        world,
        init_method=init_method,
        store=store,
        backend=backend,
        device=device,
        timeout_s=timeout_s,
        group_name=token,
    )
    with _LOCK:
        _COMMS[(token, _worker_address())] = comm
    return comm.backend


def _leave(token: str, dask_worker: Any = None) -> None:
    key = (token, str(dask_worker.address))
    with _LOCK:
        comm = _COMMS.pop(key, None)
        _STORES.pop(token, None)  # only rank 0's worker holds one
    if comm is not None:
        comm.close()


def _call(rank: int, token: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(local_comm(token), *args)


# Collective tasks metered as a stage (Fine Performance Metrics page), by their `what`.
STAGE_OF_TASK = {"train pass": "train", "eval holdout": "eval"}


def _call_in_stage(stage: str, rank: int, token: str, fn: Callable[..., Any], *args: Any) -> Any:
    with stage_span(stage):
        return fn(local_comm(token), *args)


class CommGroup:
    """The client's handle on a group formed on Dask workers by :func:`init_comm`.

    ``addresses[r]`` is rank ``r``'s worker. Use it as a context manager, or call
    :meth:`close`, so every worker drops its group.
    """

    def __init__(
        self,
        client: Any,
        addresses: Sequence[str],
        token: str,
        backend: str,
        timeout_s: float,
    ) -> None:
        self.client = client
        self.addresses = tuple(addresses)
        self.token = token
        self.backend = backend
        self.timeout_s = timeout_s

    @property
    def world_size(self) -> int:
        return len(self.addresses)

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        rank_args: Sequence[Sequence[Any]] | None = None,
        what: str | None = None,
    ) -> list[Any]:
        """Run ``fn(comm, *rank_args[r], *args)`` on every rank at once; results in rank
        order. ``fn`` may run collectives; arguments may be futures living on that worker."""
        stage = STAGE_OF_TASK.get(what or "")
        head = (stage,) if stage else ()
        per_rank = [
            (*head, r, self.token, fn, *(rank_args[r] if rank_args is not None else ()))
            for r in range(self.world_size)
        ]
        return run_pinned(
            self.client,
            self.addresses,
            _call_in_stage if stage else _call,
            *args,
            rank_args=per_rank,
            what=what or str(getattr(fn, "__name__", "collective task")),
        )

    def close(self) -> None:
        """Every reachable worker drops its group (rank 0 also stops the store)."""
        try:
            # A lost worker's address would cost a connect timeout: skip it.
            lost = set(missing_workers(self.client, self.addresses))
            alive = [a for r, a in enumerate(self.addresses) if r not in lost]
            self.client.run(_leave, self.token, workers=alive, on_error="ignore")
        except Exception as e:  # the reachable workers closed anyway
            log.warning("closing process group %s: %s", self.token, e)

    def __enter__(self) -> CommGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CommGroup(world_size={self.world_size}, backend={self.backend!r})"


def init_comm(
    client: Any,
    addresses: Sequence[str] | None = None,
    *,
    backend: str | None = None,
    device: str = "cpu",
    timeout_s: float = 60.0,
    init_method: str = "tcp",
    run_dir: str | Path | None = None,
) -> CommGroup:
    """Form one process group over the workers ``addresses`` (rank order; default: every
    worker, sorted by address).

    ``init_method`` is ``"tcp"`` (rank 0's worker serves a TCP store on a free port) or
    ``"file"`` (a FileStore under ``run_dir``: one machine or a shared file system). Raises
    :class:`CommError` / :class:`WorkerLostError` when a rank does not join within
    ``timeout_s``.
    """
    from daskhps.passes.owners import worker_addresses

    addrs = list(addresses) if addresses is not None else worker_addresses(client)
    if not addrs:
        raise CommError("the cluster has no workers: start some before forming the group")
    world = len(addrs)
    token = f"daskhps-{uuid.uuid4().hex[:12]}"
    if init_method == "tcp":
        if world > 1:
            port = run_pinned(
                client, addrs[:1], _serve_store, token, world, timeout_s, what="serve store"
            )[0]
            method = f"tcp://{_host_of(addrs[0])}:{port}"
        else:
            method = "tcp://127.0.0.1:0"  # unused: one rank needs no store
    elif init_method == "file":
        if run_dir is None:
            raise CommError("init_method='file' needs run_dir (a directory every worker sees)")
        path = Path(run_dir) / "comm" / token
        path.parent.mkdir(parents=True, exist_ok=True)
        method = f"file://{path}"
    else:
        raise CommError(f"init_method {init_method!r} must be 'tcp' or 'file'")
    group = CommGroup(client, addrs, token, backend or "", timeout_s)
    try:
        backends = run_pinned(
            client,
            addrs,
            _join,
            token,
            world,
            method,
            backend,
            device,
            timeout_s,
            rank_args=[(r,) for r in range(world)],
            what="process group rendezvous",
            timeout_s=timeout_s + 10.0,  # the ranks' own timeout fires first
        )
    except BaseException:
        group.close()
        raise
    group.backend = backends[0]
    log.info("process group %s: %d ranks, %s, %s", token, world, group.backend, method)
    return group


def _host_of(address: str) -> str:
    """Host of a worker address; in-process workers (``inproc://``) are on this machine."""
    from distributed.comm import get_address_host

    if address.startswith("inproc://"):
        return "127.0.0.1"
    return str(get_address_host(address))

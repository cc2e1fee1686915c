"""Start or connect to the Dask cluster of a run, and tear it down cleanly.

Three kinds: an embedded ``LocalCluster`` (the default), a ``LocalCUDACluster`` (one worker per
GPU, needs ``dask_cuda`` and CUDA), or an existing scheduler address (a real cluster; only the
client is closed at the end). The handle lists the workers in rank order.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import dask
from distributed import Client, LocalCluster

from daskhps import _forkserver as forkserver
from daskhps._gpu import cuda_cluster, cuda_missing
from daskhps._scheduler import scheduler_workers
from daskhps.config.cluster import ClusterSecurity
from daskhps.distributed._dashboard import repair_dashboard
from daskhps.distributed._errors import ClusterError
from daskhps.distributed._expected import quiet_sync_cancel_race, quiet_worker_kills
from daskhps.distributed._worker_setup import setup_workers
from daskhps.errors import ConfigError

__all__ = ["ClusterHandle", "KeptCluster", "probe_scheduler", "start_cluster"]

log = logging.getLogger(__name__)

# Each Dask worker keeps one statistical profile per second for the last
# `distributed.admin.low-level-log-length` seconds (1000 by default: the dashboard's profile
# timeline). At daskhps's call stacks a second of profile is about 0.12 MiB, so a worker grew
# by about 120 MiB over its first 17 minutes, which no part of the run accounts for. The
# embedded cluster keeps two minutes; workers started with `dask worker` keep their config's.
_HISTORY_KEY = "distributed.admin.low-level-log-length"
PROFILE_HISTORY_CYCLES = 120


@dataclass
class ClusterHandle:
    """A running client (and the cluster it started, if any). Close it, or use ``with``."""

    client: Client
    cluster: Any | None
    kind: Literal["local", "local-cuda", "address"]
    dashboard_link: str | None
    addresses: tuple[str, ...] = field(default=())

    @property
    def world_size(self) -> int:
        return len(self.addresses)

    def close(self) -> None:
        """Close the client, then the cluster this handle started (even if the first fails,
        and on Ctrl-C). Safe to call twice."""
        client, cluster = self.client, self.cluster
        self.cluster = None
        try:
            if client.status not in ("closed", "closing"):
                client.close()
        finally:
            if cluster is not None:
                with quiet_worker_kills():
                    cluster.close()

    def __enter__(self) -> ClusterHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            _quiet_teardown()
        self.close()


class KeptCluster:
    """A cluster that outlives the run it was started for: the first :meth:`get` starts it
    (the caller's way), later ones return it, and its owner closes it (``with``). A retraining
    job keeps its candidate's cluster up to publish with the workers that hold the stores."""

    def __init__(self) -> None:
        self.handle: ClusterHandle | None = None

    def get(self, start: Callable[[], ClusterHandle]) -> ClusterHandle:
        if self.handle is None:
            self.handle = start()
        return self.handle

    def __enter__(self) -> KeptCluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.__exit__(exc_type, *exc)


def _quiet_teardown() -> None:
    """After Ctrl-C the run is over and the process exits: what Dask logs while its cluster
    goes down mid-task (broadcasts to closed workers, futures nobody awaits any more) is not
    something the user can act on, and would bury the one line that says where to resume."""
    for name in ("distributed", "asyncio", "tornado"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def start_cluster(
    *,
    address: str | None = None,
    n_workers: int | None = 1,
    threads_per_worker: int = 2,
    memory_limit: str | int | float | None = "auto",
    processes: bool = True,
    gpus: bool | Literal["auto"] = False,
    dashboard_address: str | None = "127.0.0.1:8787",
    local_directory: str | None = None,
    worker_env: Mapping[str, str] | None = None,
    cuda_visible_devices: Sequence[int] | None = None,
    wait_timeout_s: float = 60.0,
    security: ClusterSecurity | None = None,
    storage_options: Mapping[str, Mapping[str, Any]] | None = None,
) -> ClusterHandle:
    """Start an embedded cluster, or connect to ``address``; wait for the workers.

    Parameters
    ----------
    address:
        Scheduler address of an existing cluster; the other cluster options are then
        ignored, except ``n_workers`` (how many workers to wait for; None: those present).
    n_workers, threads_per_worker, memory_limit, processes:
        Embedded cluster. Two or more threads let the next pass stage while one trains.
    gpus:
        ``True``: a ``LocalCUDACluster`` (one worker per visible GPU unless ``n_workers``),
        an error without ``dask_cuda`` or CUDA; ``"auto"``: that when possible, else a
        ``LocalCluster`` (logged); ``False``: a ``LocalCluster``.
    dashboard_address:
        Where the dashboard listens (``None``: no dashboard). Defaults to this machine only.
    worker_env:
        Extra environment of worker processes (for instance ``OMP_NUM_THREADS``, which
        Dask sets to 1 in worker processes, for torch's intra-op threads).
    security:
        TLS files for a ``tls://`` ``address`` (``cluster.security``).
    storage_options:
        fsspec options per protocol (``storage.options``) for the driver and every worker.
    """
    quiet_sync_cancel_race()  # a Ctrl-C at the wrong instant must not print a traceback
    if address is not None:
        return _connect(address, n_workers, wait_timeout_s, security, storage_options)
    use_cuda = _use_cuda(gpus)
    _check_shape(n_workers, threads_per_worker)
    kwargs: dict[str, Any] = {
        "n_workers": n_workers,
        "threads_per_worker": threads_per_worker,
        "memory_limit": memory_limit,
        "dashboard_address": dashboard_address,
    }
    if local_directory is not None:
        kwargs["local_directory"] = local_directory
    if worker_env:
        kwargs["env"] = dict(worker_env)
    forks = processes and not use_cuda and forkserver.available()  # see daskhps._forkserver
    cluster, client = _start_local(
        use_cuda, processes, n_workers, cuda_visible_devices, kwargs, forks
    )
    handle = ClusterHandle(client, cluster, "local-cuda" if use_cuda else "local", None)
    try:
        _finish(handle, len(cluster.workers), wait_timeout_s, dashboard_address is not None)
        setup_workers(
            client,
            ignore_sigint=use_cuda or processes,
            storage_options=storage_options,
            # a forked worker starts in the fork server's directory; a spawned one in ours
            cwd=os.getcwd() if forks else None,
        )
        repair_dashboard(client)
    except BaseException:
        handle.close()
        raise
    return handle


def _use_cuda(gpus: bool | Literal["auto"]) -> bool:
    """Whether the embedded cluster is a ``LocalCUDACluster``; ``gpus=True`` without CUDA is
    an error, ``"auto"`` falls back to the CPU (logged)."""
    if cuda_missing(gpus):
        raise ClusterError(
            "gpus=True needs dask_cuda and a CUDA device, and this machine lacks one: install "
            "the gpu extra on a GPU machine, or set gpus to 'auto' or False to train on CPU"
        )
    use_cuda = cuda_cluster(gpus)
    if gpus == "auto" and not use_cuda:
        log.info("gpus='auto': no dask_cuda or no CUDA device, starting a CPU LocalCluster")
    return use_cuda


def _check_shape(n_workers: int | None, threads_per_worker: int) -> None:
    if n_workers is not None and n_workers < 1:
        raise ClusterError(f"n_workers must be >= 1, got {n_workers}")
    if threads_per_worker < 1:
        raise ClusterError(f"threads_per_worker must be >= 1, got {threads_per_worker}")


def _start_local(
    use_cuda: bool,
    processes: bool,
    n_workers: int | None,
    cuda_visible_devices: Sequence[int] | None,
    kwargs: dict[str, Any],
    forks: bool,
) -> tuple[Any, Client]:
    """The embedded cluster and a client of it (``forks``: its workers forked from the fork
    server); a cluster that started is closed again when the client cannot be made, and any
    error but ours is a :class:`ClusterError`."""
    # The embedded scheduler's p2p shuffle plugin logs the start and end of every shuffle at
    # WARNING; a pass runs several, and the lines would bury the progress bar.
    logging.getLogger("distributed.shuffle._scheduler_plugin").setLevel(logging.ERROR)
    # While the embedded cluster closes, the scheduler's batched stream to a worker that
    # closed first may log its CommClosedError with a traceback at INFO: shutdown noise.
    logging.getLogger("distributed.batched").setLevel(logging.WARNING)
    cluster: Any = None
    if forks:  # workers forked from a server that imported their code once
        kwargs["env"] = forkserver.worker_env(kwargs.get("env"))
    started = forkserver.forked_workers() if forks else contextlib.nullcontext()
    try:
        with dask.config.set({_HISTORY_KEY: PROFILE_HISTORY_CYCLES}), started:
            cluster = _local_cluster(use_cuda, processes, n_workers, cuda_visible_devices, kwargs)
        return cluster, Client(cluster)
    except BaseException as e:
        if cluster is not None:
            cluster.close()
        if isinstance(e, Exception) and not isinstance(e, ClusterError):
            raise ClusterError(f"could not start the embedded Dask cluster: {e}") from e
        raise


def _local_cluster(
    use_cuda: bool,
    processes: bool,
    n_workers: int | None,
    cuda_visible_devices: Sequence[int] | None,
    kwargs: dict[str, Any],
) -> Any:
    if use_cuda:
        from dask_cuda import LocalCUDACluster

        if cuda_visible_devices is not None:
            kwargs["CUDA_VISIBLE_DEVICES"] = list(cuda_visible_devices)
        if n_workers is None:
            kwargs.pop("n_workers")
        return LocalCUDACluster(**kwargs)
    if kwargs["dashboard_address"] is None:
        # No dashboard pages; the scheduler's HTTP server (health, /metrics) still starts, so
        # keep it on this machine and off the default port.
        kwargs["dashboard_address"] = "127.0.0.1:0"
        kwargs["scheduler_kwargs"] = {"dashboard": False}
    return LocalCluster(processes=processes, **kwargs)


def dask_security(security: ClusterSecurity | None) -> Any:
    """``cluster.security`` as Dask's ``Security`` (None: none); a file that is missing is a
    ConfigError naming its key."""
    if security is None:
        return None
    from distributed import Security

    for key in ("ca_file", "cert_file", "key_file"):
        path = getattr(security, key)
        if not os.path.isfile(path):
            raise ConfigError(f"cluster.security.{key}: no such file {path!r}")
    return Security(
        tls_ca_file=security.ca_file,
        tls_client_cert=security.cert_file,
        tls_client_key=security.key_file,
        require_encryption=True,
    )


# A scheduler that is starting binds its port within a second or two; a port still refused
# after this long has no scheduler behind it, and the user should hear so at once.
REFUSED_GRACE_S = 5.0


def probe_scheduler(address: str, grace_s: float = REFUSED_GRACE_S) -> None:
    """Raise :class:`ClusterError` at once when nothing can listen at ``address`` (its host
    does not resolve) or after ``grace_s`` of refused connections; return as soon as the port
    takes a connection, or when the outcome is not certain (no answer yet: a slow network or a
    busy scheduler), leaving the wait to the client's timeout."""
    from distributed.comm.addressing import get_address_host_port, parse_address

    if parse_address(address)[0] not in ("tcp", "tls"):
        return
    try:
        host, port = get_address_host_port(address)
    except ValueError:
        return  # Dask's own error says what is wrong with it
    deadline = time.monotonic() + grace_s
    while True:
        try:
            socket.create_connection((host, port), timeout=min(grace_s, 2.0)).close()
            return
        except socket.gaierror as e:
            raise ClusterError(
                f"cluster.address {address}: cannot resolve {host!r} ({e.strerror}); fix the "
                "host name"
            ) from None
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"cluster.address {address}: no Dask scheduler there (connection refused "
                    f"for {grace_s:g} s); start it (`dask scheduler --port {port}`) or fix the "
                    "address"
                ) from None
            time.sleep(0.25)
        except OSError:
            return


def _connect(
    address: str,
    n_workers: int | None,
    wait_timeout_s: float,
    security: ClusterSecurity | None,
    storage_options: Mapping[str, Mapping[str, Any]] | None = None,
) -> ClusterHandle:
    tls = dask_security(security)
    probe_scheduler(address)
    try:
        client = Client(address, timeout=wait_timeout_s, security=tls)
    except Exception as e:
        raise ClusterError(
            f"could not reach the Dask scheduler at {address!r} (cluster.address) within "
            f"{wait_timeout_s:g} s: {e}; check the address and that the scheduler is running"
        ) from e
    handle = ClusterHandle(client, None, "address", None)
    try:
        _finish(handle, n_workers, wait_timeout_s, True)
        # Their Ctrl-C is their owner's.
        setup_workers(client, ignore_sigint=False, storage_options=storage_options)
    except BaseException:
        handle.close()
        raise
    return handle


def _finish(
    handle: ClusterHandle, n_workers: int | None, timeout_s: float, dashboard: bool
) -> None:
    """Wait for the workers, record them in rank order, log the dashboard link."""
    from daskhps.passes.owners import worker_addresses

    client = handle.client
    if n_workers:
        try:
            client.wait_for_workers(n_workers, timeout=timeout_s)
        except TimeoutError as e:
            have = len(scheduler_workers(client))
            raise ClusterError(
                f"only {have} of {n_workers} Dask workers joined within {timeout_s:g} s: "
                "start more workers, lower n_workers, or raise the wait timeout"
            ) from e
    handle.addresses = tuple(worker_addresses(client))
    if not handle.addresses:
        where = (
            f"the scheduler at {client.scheduler_info(n_workers=0).get('address')}"
            if handle.kind == "address"
            else "the cluster"
        )
        raise ClusterError(
            f"{where} has no workers: start some (`dask worker ADDRESS`), or leave "
            "cluster.address out for an embedded cluster"
        )
    # client.dashboard_link is formatted from a template even when no dashboard runs.
    services = client.scheduler_info(n_workers=0).get("services", {})
    link = client.dashboard_link if dashboard and "dashboard" in services else None
    handle.dashboard_link = link
    log.info(
        "Dask cluster (%s): %d workers; dashboard: %s",
        handle.kind,
        len(handle.addresses),
        link or "none",
    )

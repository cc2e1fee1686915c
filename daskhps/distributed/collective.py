"""torch.distributed for one run: one rank's handle on an explicit process group.

Each rank holds a :class:`Comm`, a plain object around an explicit ``ProcessGroup`` (gloo on
CPU, nccl on CUDA). The default group of ``init_process_group`` is deliberately not used:

* a Dask worker may be a thread of the client process (``processes=False``), and one process
  cannot host several ranks of the default group, but it can host several explicit groups;
* there is no process-global state to leak between runs (tests, retraining in one process).

This module is torch only: how the ranks of a Dask cluster find each other is
:mod:`daskhps.distributed.rendezvous`. A lost peer surfaces as :class:`CommError` (a
collective or the rendezvous failed or timed out after ``timeout_s``), never as a hang.

Every collective adds the bytes this rank sends to and receives from *other* ranks to
:attr:`Comm.traffic`, by the kind of what it carries (``keys``, ``rows``, ``grads``,
``dense``; ``other`` unless the caller says). The counts are the split sizes the call is
given times the bytes of a row: integer adds, no extra collective. A rank's own split never
touches the network and is not counted. An all-reduce counts what the ring algorithm moves,
``2 (n - 1) / n`` of the tensor each way (gloo's all-reduce is a ring; NCCL's tree moves about
as much): the algorithm is not visible from here, so that figure is a model, not a count.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from daskhps.distributed._errors import CommError

__all__ = ["Comm", "Traffic", "ring_allreduce_bytes"]

log = logging.getLogger(__name__)


class Traffic:
    """Bytes one rank sent to and received from the other ranks, by kind, since the last
    :meth:`take`. Plain integer adds: cheap enough for every collective of every batch."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.received: dict[str, int] = {}

    def add(self, kind: str, sent: int, received: int) -> None:
        self.sent[kind] = self.sent.get(kind, 0) + sent
        self.received[kind] = self.received.get(kind, 0) + received

    def take(self) -> dict[str, tuple[int, int]]:
        """``{kind: (sent, received)}`` so far, and start again from zero."""
        out = {k: (self.sent[k], self.received.get(k, 0)) for k in self.sent}
        self.sent, self.received = {}, {}
        return out


def ring_allreduce_bytes(nbytes: int, world_size: int) -> int:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``nbytes``:
    ``2 (n - 1) / n`` of them (a reduce-scatter, then an all-gather), the least any
    all-reduce algorithm moves per rank."""
    return 2 * (world_size - 1) * nbytes // world_size if world_size > 1 else 0


def _row_bytes(t: torch.Tensor) -> int:
    """Bytes of one row (``t[0]``) of ``t``, also when it has no rows."""
    return math.prod(t.shape[1:]) * t.element_size()


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
        self.traffic = Traffic()  # bytes to and from the other ranks, by kind

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
        kind: str = "other",
    ) -> None:
        """Rows ``input[splits[j]]`` go to rank ``j``; rank ``i``'s rows land in
        ``output[out_splits[i]]`` (uneven and empty splits allowed). The rows to and from
        the other ranks count in :attr:`traffic` as ``kind``."""
        if self.pg is None:
            output.copy_(input)
            return
        me = self.rank
        self.traffic.add(
            kind,
            (sum(input_split_sizes) - input_split_sizes[me]) * _row_bytes(input),
            (sum(output_split_sizes) - output_split_sizes[me]) * _row_bytes(output),
        )
        opts = dist.AllToAllOptions()
        self._wait(
            "all_to_all_single",
            lambda: self.pg.alltoall_base(
                output, input, list(output_split_sizes), list(input_split_sizes), opts
            ),
        )

    def all_reduce(self, tensor: torch.Tensor, kind: str = "other") -> None:
        """Sum ``tensor`` across ranks, in place; counts in :attr:`traffic` as ``kind``, at
        a ring's bytes (:func:`ring_allreduce_bytes`)."""
        if self.pg is None:
            return
        ring = ring_allreduce_bytes(tensor.numel() * tensor.element_size(), self.world_size)
        self.traffic.add(kind, ring, ring)
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
                f"rank {self.rank} of {self.world_size}: {op} failed: {gloo_reason(e)}; a peer "
                "rank was "
                f"lost (its worker died) or stalled for more than {self.timeout_s:g} s "
                "(cluster.dist_timeout_s: raise it where one rank's work between collectives, "
                "such as staging from a store the page cache cannot hold, can take longer)"
            ) from e  # whether the run goes on (a restart) or stops is the trainer's to say

    def __repr__(self) -> str:
        return f"Comm(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r})"


# gloo's message for a lost peer: its source file, the reason, then a banner for the reader
# of a crash report ("This is typically caused by a remote worker crashing. ... GLHF!").
_GLOO_SOURCE = re.compile(r"^\[[^\]]*gloo[^\]]*\]\s*")
_GLOO_BANNER = " This is typically caused by"


def gloo_reason(error: BaseException) -> str:
    """The reason in a collective's error, without gloo's source location and banner."""
    text = _GLOO_SOURCE.sub("", str(error).strip())
    return text.split(_GLOO_BANNER, 1)[0].rstrip(". ") or type(error).__name__


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

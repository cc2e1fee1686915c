"""The per-mini-batch embedding exchange: keys to owners, rows back, gradients to owners.

Pure torch.distributed collectives (no Dask inside the batch loop), vectorised over keys.
Example with 2 ranks, where keys ``a, b`` belong to rank 0 and ``c, d, e`` to rank 1::

                         rank 0                        rank 1
    batch keys           [a c a d]                     [b d d e]
    route: unique keys,  [a | c d]   send [1, 2]       [b | d e]   send [1, 2]
    grouped by owner          \\________ all_to_all_single (counts, keys) ________/
    owned (by requester) [a | b]     recv [1, 1]       [c d | d e] recv [2, 2]
    pull_rows            lookup_fn([a b])              lookup_fn([c d d e])
                              \\________ all_to_all_single (rows back) _________/
    rows of unique keys  [ra | rc rd]                  [rb | rd re]
    ... forward/backward: gradients of the unique rows, same order ...
    push_grads           [ga | gc gd] ---- all_to_all_single ----> owners
                         apply_fn([a b], ...)          apply_fn([c d d e], ...)  (d twice:
                                                       the table sums duplicate keys)

``rows[routing.inverse]`` gives the batch's rows in batch order. With one rank everything
short-circuits to local calls with the same results.

Rows of different widths (several tables, :class:`KeyWidths`): rows and gradients are
``float[n, widest]`` on both ends, zero beyond a key's width, but each travels packed, its
key's first ``width`` floats only (:mod:`daskhps.distributed.widths`). The split sizes in
floats come from the keys each side already holds (``owned`` on the owner, ``keys`` on the
requester), so packing adds no collective. When every table is as wide as the widest there
is nothing to pack and the exchange is the plain one, byte for byte.

What crosses the network is counted on the rank's :attr:`Comm.traffic` by kind: ``keys``
(the per-owner key counts, 8 bytes to each other rank, and the keys), ``rows``, ``grads``
(packed: the floats actually sent) and ``dense`` (the dense gradients' all-reduce); a rank's
keys it owns itself stay local.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from daskhps.distributed._errors import CommError
from daskhps.distributed.collective import Comm
from daskhps.distributed.widths import KeyWidths, pack_rows, split_floats, unpack_rows
from daskhps.sharding import ShardMap

__all__ = ["Exchange", "KeyWidths", "Routing"]

LookupFn = Callable[[torch.Tensor], torch.Tensor]
ApplyFn = Callable[[torch.Tensor, torch.Tensor], None]


@dataclass(frozen=True)
class Routing:
    """Where the keys of one local batch go, and which keys this rank serves.

    ::

        keys          [ unique keys owned by rank 0 | by rank 1 | ... ]   (sorted in a group)
        send_counts     len of each group ------------^
        inverse       position in ``keys`` of every batch key (shape of the batch)
        owned         [ keys requested by rank 0 | by rank 1 | ... ]      (this rank owns all)
        recv_counts     len of each group ------------^
        order         [ batch positions of keys[0] | of keys[1] | ... ]  (ascending in a group)
        offsets       [ 0, end of keys[0]'s group, ..., len(order) ]     (len(keys) + 1)

    ``order`` and ``offsets`` (optional) let the gradient of the unique rows be summed group by
    group in a fixed order (see ``daskhps.training.worker``), without another sort.
    """

    keys: torch.Tensor
    inverse: torch.Tensor
    send_counts: list[int]
    owned: torch.Tensor
    recv_counts: list[int]
    order: torch.Tensor | None = None
    offsets: torch.Tensor | None = None


class Exchange:
    """Exchange of embedding rows and their gradients between the ranks of ``comm``.

    Every rank calls the same methods in the same order (they are collectives). ``comm``
    may be None for a single rank. ``widths`` (several tables of different widths): rows
    and gradients travel packed, see the module docstring.
    """

    def __init__(
        self, comm: Comm | None, shard_map: ShardMap, widths: KeyWidths | None = None
    ) -> None:
        world = comm.world_size if comm is not None else 1
        if shard_map.num_workers != world:
            raise CommError(
                f"shard map for {shard_map.num_workers} workers used with {world} ranks: "
                "build the ShardMap with num_workers equal to the number of ranks"
            )
        self.comm = comm
        self.shard_map = shard_map
        self.world_size = world
        self.device = comm.device if comm is not None else torch.device("cpu")
        self._ones = [1] * world
        self.widths = widths
        # Equal widths: packing would copy every row to send the same bytes.
        self._packed = widths if widths is not None and not widths.uniform else None

    def route(self, keys: torch.Tensor) -> Routing:
        """Deduplicate a batch's keys, group them by owner and tell each owner its keys."""
        keys = keys.to(self.device, torch.int64)
        uniq, inv, pos, offsets, group = _dedup(keys.reshape(-1))
        if self.world_size == 1:
            n = [len(uniq)]
            return Routing(uniq, inv.reshape(keys.shape), n, uniq, n, pos, offsets)
        owner = self.shard_map.worker(uniq)
        order = torch.argsort(owner, stable=True)  # stable: keys stay sorted in a group
        uniq = uniq[order]
        where = torch.empty_like(order)
        where[order] = torch.arange(len(order), device=order.device)
        inv = where[inv].reshape(keys.shape)
        pos, offsets = _regroup(pos, offsets, group, order, where)
        send = torch.bincount(owner, minlength=self.world_size)
        recv = torch.empty_like(send)
        comm = self._comm()
        comm.all_to_all_single(recv, send, self._ones, self._ones, kind="keys")
        send_l, recv_l = send.tolist(), recv.tolist()
        owned = torch.empty(sum(recv_l), dtype=torch.int64, device=self.device)
        comm.all_to_all_single(owned, uniq, recv_l, send_l, kind="keys")
        return Routing(uniq, inv, send_l, owned, recv_l, pos, offsets)

    def pull_rows(self, routing: Routing, lookup_fn: LookupFn) -> torch.Tensor:
        """Rows of ``routing.keys`` (``float[len(keys), dim]``): every owner answers
        ``lookup_fn(owned)`` for its requesters (called with an empty tensor when nobody
        asks). With packed widths ``dim`` is the widest, and the rows are zero beyond each
        key's width whatever ``lookup_fn`` left there."""
        served = lookup_fn(routing.owned).to(self.device)
        kw = self._packed
        if kw is not None:
            _check_width(served, len(routing.owned), kw, "pull_rows: lookup_fn returned")
            if self.world_size == 1:  # what the packed transfer would leave
                return served.masked_fill(~kw.mask(routing.owned), 0)
            return self._packed_all_to_all(kw, routing, served, to_owners=False)
        if self.world_size == 1:
            return served
        out = served.new_empty((len(routing.keys), *served.shape[1:]))
        self._comm().all_to_all_single(
            out, served.contiguous(), routing.send_counts, routing.recv_counts, kind="rows"
        )
        return out

    def push_grads(self, routing: Routing, grads: torch.Tensor, apply_fn: ApplyFn) -> None:
        """Send the gradients of ``routing.keys`` (same order as :meth:`pull_rows`'s rows)
        to their owners, which call ``apply_fn(owned, grads_of_owned)``. With packed widths
        only each key's first ``width`` columns are sent and the owner's gradients are zero
        beyond them."""
        grads = grads.detach().to(self.device)
        if grads.shape[0] != len(routing.keys):
            raise CommError(
                f"push_grads: {grads.shape[0]} gradient rows for {len(routing.keys)} routed "
                "keys; pass the gradient of the pulled rows, in their order"
            )
        kw = self._packed
        if kw is not None:
            _check_width(grads, len(routing.keys), kw, "push_grads: got gradients")
            if self.world_size == 1:
                apply_fn(routing.owned, grads.masked_fill(~kw.mask(routing.keys), 0))
                return
            apply_fn(routing.owned, self._packed_all_to_all(kw, routing, grads, to_owners=True))
            return
        if self.world_size == 1:
            apply_fn(routing.owned, grads)
            return
        out = grads.new_empty((len(routing.owned), *grads.shape[1:]))
        self._comm().all_to_all_single(
            out, grads.contiguous(), routing.recv_counts, routing.send_counts, kind="grads"
        )
        apply_fn(routing.owned, out)

    def allreduce_dense(self, params: torch.nn.Module | Iterable[torch.nn.Parameter]) -> None:
        """Sum the dense gradients across ranks in one flattened bucket (the trainer then
        divides by the global batch size). A parameter without a gradient counts as zero,
        so every rank sends the same layout."""
        if isinstance(params, torch.nn.Module):
            params = params.parameters()
        ps = [p for p in params if p.requires_grad]
        if self.world_size == 1 or not ps:
            return
        for p in ps:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1).to(self.device) for p in ps])  # type: ignore[union-attr]
        self._comm().all_reduce(flat, kind="dense")
        offset = 0
        for p in ps:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))  # type: ignore[union-attr]
            offset += n

    def _packed_all_to_all(
        self, kw: KeyWidths, routing: Routing, rows: torch.Tensor, *, to_owners: bool
    ) -> torch.Tensor:
        """Send ``rows`` packed: gradients of ``routing.keys`` to their owners
        (``to_owners``), or rows of ``routing.owned`` back to their requesters. Returns the
        received rows, ``[n, widest]`` zero beyond each key's width. Each side sizes the
        splits in floats from the keys it holds: both hold the same keys in the same order."""
        if to_owners:
            keys, counts, kind = routing.keys, routing.send_counts, "grads"
            out_keys, out_counts = routing.owned, routing.recv_counts
        else:
            keys, counts, kind = routing.owned, routing.recv_counts, "rows"
            out_keys, out_counts = routing.keys, routing.send_counts
        widths, out_widths = kw.of(keys), kw.of(out_keys)
        out_split = split_floats(out_widths, out_counts)
        flat = rows.new_empty(sum(out_split))
        self._comm().all_to_all_single(
            flat, pack_rows(rows, widths), out_split, split_floats(widths, counts), kind=kind
        )
        return unpack_rows(flat, out_widths, kw.widest)

    def _comm(self) -> Comm:
        assert self.comm is not None  # world_size > 1 implies a group
        return self.comm


def _check_width(rows: torch.Tensor, n: int, kw: KeyWidths, what: str) -> None:
    if rows.shape != (n, kw.widest):
        raise CommError(
            f"{what} shape {tuple(rows.shape)} for {n} keys; with widths {list(kw.dims)} "
            f"rows are [keys, {kw.widest}] (the widest table), zero beyond a key's width"
        )


def _dedup(
    flat: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.unique(flat, sorted=True, return_inverse=True)`` from one stable sort, which
    also yields each key's positions: ``(unique, inverse, order, offsets, group)`` where
    ``order[offsets[i]:offsets[i + 1]]`` are the positions of ``unique[i]`` (ascending) and
    ``group[j]`` is the unique index of ``flat[order[j]]``."""
    n = flat.numel()
    skeys, order = torch.sort(flat, stable=True)
    first = torch.empty(n, dtype=torch.bool, device=flat.device)
    first[:1] = True
    torch.ne(skeys[1:], skeys[:-1], out=first[1:])
    uniq = skeys[first]
    group = first.cumsum(0).sub_(1)
    inverse = torch.empty_like(order).scatter_(0, order, group)
    end = torch.full((1,), n, dtype=torch.int64, device=flat.device)
    offsets = torch.cat([first.nonzero().squeeze(1), end])
    return uniq, inverse, order, offsets, group


def _regroup(
    pos: torch.Tensor,
    offsets: torch.Tensor,
    group: torch.Tensor,
    perm: torch.Tensor,
    where: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reorder the position groups of :func:`_dedup` after the unique keys were permuted
    (``new[i] = old[perm[i]]``, ``where`` its inverse); positions keep their order in a group."""
    sizes = offsets.diff()
    new_offsets = torch.zeros_like(offsets)
    torch.cumsum(sizes[perm], 0, out=new_offsets[1:])
    dest = new_offsets[where[group]] + (torch.arange(len(pos), device=pos.device) - offsets[group])
    return torch.empty_like(pos).scatter_(0, dest, pos), new_offsets

"""A batch's ``sparse`` model input: its keys' unique rows pulled from their owners, then
gathered (or pooled bag by bag) and laid out as the model reads them. The trainer's ranks
and the scorer share it, so both build the same input bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from daskhps.data.schema import Schema
from daskhps.distributed import Exchange
from daskhps.distributed.exchange import Routing
from daskhps.models import pool

__all__ = [
    "BagPooling",
    "LookupFn",
    "bag_pooling",
    "batch_forward",
    "field_columns",
    "pull_batch",
    "sparse_input",
]

LookupFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class BagPooling:
    """How a multi-hot schema's bags become one row per (example, field).

    ``mode`` is what :func:`pool` runs for every bag; ``mean_fields`` (``bool[F]``) is set only
    when the fields mix modes: then ``mode`` is ``"sum"`` and those fields are divided by their
    bag lengths afterwards.
    """

    mode: Literal["sum", "mean"]
    num_fields: int
    mean_fields: torch.Tensor | None = None


def bag_pooling(schema: Schema) -> BagPooling | None:
    """The pooling of ``schema``'s bags; None for a single-hot schema (no pooling at all)."""
    fields = schema.categorical
    if not any(f.multi_hot for f in fields):
        return None
    # A single-hot bag holds exactly one key, so sum and mean agree on it: only the multi-hot
    # fields decide whether one pool call covers every field.
    modes = {f.pooling for f in fields if f.multi_hot}
    if modes == {"sum"} or modes == {"mean"}:
        return BagPooling("sum" if modes == {"sum"} else "mean", len(fields))
    mean = torch.tensor([f.multi_hot and f.pooling == "mean" for f in fields])
    return BagPooling("sum", len(fields), mean)


def pull_batch(
    exchange: Exchange, lookup_fn: LookupFn, keys: torch.Tensor
) -> tuple[Routing, torch.Tensor]:
    """Route a batch's keys and pull their unique rows as a leaf that collects their gradient."""
    routing = exchange.route(keys)
    rows = exchange.pull_rows(routing, lookup_fn)
    return routing, rows.detach().requires_grad_(True)


class _GatherRows(torch.autograd.Function):
    """``leaf.index_select(0, index)`` whose backward sums each row's gradients group by group
    with ``embedding_bag`` over the batch positions already grouped by :meth:`Exchange.route`
    (``order``, ``offsets``): the same sums as ``index_add_``, in the same (ascending position)
    order, bit for bit, without its serial scatter."""

    @staticmethod
    def forward(
        ctx: Any,
        leaf: torch.Tensor,
        index: torch.Tensor,
        order: torch.Tensor,
        offsets: torch.Tensor,
    ) -> torch.Tensor:
        ctx.save_for_backward(order, offsets)
        return leaf.index_select(0, index)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        order, offsets = ctx.saved_tensors
        summed = F.embedding_bag(
            order, grad.contiguous(), offsets, mode="sum", include_last_offset=True
        )
        return summed, None, None, None


def _gather(leaf: torch.Tensor, routing: Routing) -> torch.Tensor:
    """``leaf[routing.inverse]`` whose backward sums in a fixed order, so reruns and resumed
    runs match bit for bit: the backward of advanced indexing (``index_put_`` with accumulate)
    is not deterministic with several CPU threads. Sums group by group when the routing
    carries its position groups, else through ``index_select``'s backward (``index_add_``)."""
    index = routing.inverse
    flat = index.reshape(-1)
    if routing.order is not None and routing.offsets is not None and leaf.requires_grad:
        rows = _GatherRows.apply(leaf, flat, routing.order, routing.offsets)
    else:
        rows = leaf.index_select(0, flat)
    return rows.view(*index.shape, leaf.shape[1])


def sparse_input(
    leaf: torch.Tensor,
    routing: Routing,
    offsets: torch.Tensor | None,
    pooling: BagPooling | None,
    columns: torch.Tensor | None = None,
) -> torch.Tensor:
    """The model's ``sparse`` input ``float[n, F, D]`` from the unique rows of a batch.

    Without ``offsets`` (single-hot) the keys were ``int64[n, F]`` and the rows are gathered
    straight into place; otherwise the flat rows are pooled bag by bag. With ``columns``
    (tables of different widths: the rows are padded to the widest) the result is the flat
    ``float[n, sum of the fields' widths]`` the models read then: ``columns`` picks each
    field's own columns out of ``[n, F * widest]``.
    """
    out = _sparse_rows(leaf, routing, offsets, pooling)
    if columns is None:
        return out
    return out.reshape(out.shape[0], -1).index_select(1, columns.to(out.device))


def field_columns(widths: tuple[int, ...]) -> torch.Tensor | None:
    """The columns of :func:`sparse_input` for fields whose rows are ``widths`` wide (padded
    to the widest), or None when they are all as wide (the ``[n, F, D]`` layout stays)."""
    widest = max(widths)
    if min(widths) == widest:
        return None
    return torch.cat([f * widest + torch.arange(w) for f, w in enumerate(widths)])


def _sparse_rows(
    leaf: torch.Tensor,
    routing: Routing,
    offsets: torch.Tensor | None,
    pooling: BagPooling | None,
) -> torch.Tensor:
    if offsets is None:
        return _gather(leaf, routing)
    if pooling is None:
        raise ValueError("sparse_input: bag offsets given without a pooling (see bag_pooling)")
    nf = pooling.num_fields
    n = (offsets.numel() - 1) // nf
    # Offsets come from WorkerExamples, which builds them valid: skip the check (a device sync
    # on GPU) on every batch.
    bags = pool(_gather(leaf, routing), offsets.to(leaf.device), pooling.mode, check=False)
    out = bags.view(n, nf, leaf.shape[1])
    if pooling.mean_fields is not None:
        lengths = offsets.diff().view(n, nf).to(leaf.device)
        mean = pooling.mean_fields.to(leaf.device)
        div = torch.where(mean, lengths.clamp(min=1), torch.ones_like(lengths))
        out = out / div.to(out.dtype).unsqueeze(-1)
    return out


def batch_forward(
    model: torch.nn.Module,
    exchange: Exchange,
    lookup_fn: LookupFn,
    dense: torch.Tensor,
    keys: torch.Tensor,
    offsets: torch.Tensor | None,
    pooling: BagPooling | None,
    columns: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Routing, torch.Tensor]:
    """One batch's logits, with the routing and the leaf of unique rows whose ``.grad``
    (after backward) goes to :meth:`Exchange.push_grads`."""
    routing, leaf = pull_batch(exchange, lookup_fn, keys)
    sparse = sparse_input(leaf, routing, offsets, pooling, columns)
    return model(dense, sparse), routing, leaf

"""The worker side of training: the dense model replica and the mini-batch loop of each rank.

Every function here runs in a Dask task pinned to one rank, started on all ranks at once by
:meth:`daskhps.distributed.RunGroup.run`, which hands it the run's
:class:`~daskhps.distributed.RunHost` on that worker: the rank's process group, its table
shards, and the dense replica these functions keep there (:attr:`RunHost.replica`). Inside,
ranks talk through torch.distributed only.
One mini-batch, on every rank in lockstep::

    keys of my share ──route──► owners ──table.lookup──► rows ──► my unique rows (leaf)
    rows[inverse] (──pool bags, multi-hot schemas──►) emb[n, F, D] ──► model(dense, emb)
        ──► sum of BCE / global batch size ──► backward
    leaf.grad ──push──► owners ──table.apply_gradients (sparse optimizer)
    dense grads ──all_reduce(sum)──► clip ──► dense optimizer step (identical on every rank)

The rows' way into the model (pull, gather or pool, lay out) is :mod:`daskhps.training.model_input`.
A pass's result carries the rank's network figures (:class:`RankTraffic`): the bytes its
collectives moved by kind (counted by :class:`~daskhps.distributed.Comm`), the unique keys
of its examples by owner (what the pass needs at the least), and the bytes the shuffles that
prepared the pass brought to this worker (:mod:`daskhps.monitor.network`).
"""

from __future__ import annotations

import copy
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from daskhps.data.schema import Schema
from daskhps.distributed import Exchange, RunHost, WorkerShards
from daskhps.distributed.exchange import KeyWidths
from daskhps.models import InputLayout, ModelSpec
from daskhps.monitor.network import PassKeys, RankTraffic, take_routed
from daskhps.monitor.progress import report_batches
from daskhps.sharding import ShardMap
from daskhps.training.examples import WorkerExamples
from daskhps.training.model_input import (
    BagPooling,
    LookupFn,
    bag_pooling,
    batch_forward,
    field_columns,
    pull_batch,
    sparse_input,
)
from daskhps.training.records import Batches, KeyAdmission, RankPassResult

if TYPE_CHECKING:  # the config is what the driver builds the setup from
    from daskhps.config import RunConfig

__all__ = [
    "TrainSetup",
    "build_dense",
    "dense_checkpoint",
    "drop_trainer",
    "eval_pass",
    "load_dense_checkpoint",
    "model_state",
    "setup_trainer",
    "train_pass",
]


@dataclass(frozen=True)
class TrainSetup:
    """What every rank needs to build the same dense model replica."""

    run_id: str
    table: str
    schema: Schema
    model: ModelSpec
    layout: InputLayout  # RunConfig.input_layout: what the model is built for
    num_shards: int
    seed: int
    optimizer: str
    lr: float
    weight_decay: float
    grad_clip_norm: float | None
    threads: int | None = None
    # Several tables: their names by index (keys carry it) and each one's row width as the
    # model reads it; empty for one table (``table``). Per field: the floats of its row the
    # model reads (RunConfig.sparse_widths).
    tables: tuple[str, ...] = ()
    table_widths: tuple[int, ...] = ()
    field_widths: tuple[int, ...] = ()

    @property
    def several_tables(self) -> bool:
        return len(self.tables) > 1

    @classmethod
    def from_config(cls, config: RunConfig, run_id: str) -> TrainSetup:
        """The setup of ``config``'s dense model (model, dense optimizer, schema, seed): the
        trainer's, and the start ``daskhps import`` writes into its checkpoint."""
        opt = config.dense_optimizer
        several = config.several_tables
        return cls(
            run_id=run_id,
            table=config.table_specs()[0].name,
            schema=config.data.schema,
            model=config.model,
            layout=config.input_layout(),
            num_shards=config.passes.plan.num_shards,
            seed=config.run.seed,
            optimizer=opt.kind,
            lr=opt.lr,
            weight_decay=opt.weight_decay,
            grad_clip_norm=opt.grad_clip_norm,
            tables=tuple(t.name for t in config.embedding_tables()) if several else (),
            table_widths=tuple(s.dim for s in config.table_specs()) if several else (),
            field_widths=config.sparse_widths(),
        )


def build_dense(setup: TrainSetup) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The dense model and optimizer a run starts from: seeded, so every rank builds the
    same weights, and ``daskhps import`` writes the same start into its checkpoint."""
    torch.manual_seed(setup.seed)
    model = setup.model.build_for(setup.layout)  # as RunConfig.build_model builds it
    params = list(model.parameters())
    kind, lr, wd = setup.optimizer, setup.lr, setup.weight_decay
    opt: torch.optim.Optimizer
    if kind == "sgd":
        opt = torch.optim.SGD(params, lr=lr, weight_decay=wd)
    elif kind == "adagrad":
        opt = torch.optim.Adagrad(params, lr=lr, weight_decay=wd)
    else:
        opt = torch.optim.Adam(params, lr=lr, weight_decay=wd)
    return model, opt


class _Replica:
    """One rank's dense model, its optimizer, and what its mini-batch loop reuses."""

    def __init__(self, host: RunHost, setup: TrainSetup) -> None:
        # One torch thread unless told otherwise (Dask starts workers with OMP_NUM_THREADS=1):
        # measured on a shared 2-core machine, two OpenMP threads whose cores other processes
        # also use wait on each other's descheduled thread, and a step slowed 10 to 30 times.
        if setup.threads:
            torch.set_num_threads(setup.threads)
        comm = host.require_comm()
        self.setup = setup
        self.model, self.opt = build_dense(setup)
        widths = KeyWidths(setup.table_widths) if setup.several_tables else None
        self.exchange = Exchange(comm, ShardMap(setup.num_shards, comm.world_size), widths)
        self.shards: WorkerShards = host.require_shards()
        self.pooling = bag_pooling(setup.schema)
        self.columns = field_columns(setup.field_widths) if setup.several_tables else None
        self.widest = widths.widest if widths is not None else 0
        self.step = 0

    def lookup(self, keys: torch.Tensor, *, read_only: bool = False) -> torch.Tensor:
        """Rows of keys this rank owns: of the run's table, or of every table (padded to
        the widest, see :meth:`WorkerShards.lookup_tagged`)."""
        if self.setup.several_tables:
            return self.shards.lookup_tagged(keys, self.widest, read_only=read_only)
        return self.shards.lookup(self.setup.table, keys, read_only=read_only)

    def apply(self, keys: torch.Tensor, grads: torch.Tensor) -> None:
        """The sparse optimizer's step on rows this rank owns."""
        if self.setup.several_tables:
            self.shards.apply_tagged(keys, grads)
        else:
            self.shards.apply_gradients(self.setup.table, keys, grads)


def _replica(host: RunHost) -> _Replica:
    rep = host.replica
    if not isinstance(rep, _Replica):
        raise RuntimeError(f"rank {host.rank} has no dense replica: run setup_trainer first")
    return rep


def setup_trainer(host: RunHost, setup: TrainSetup) -> int:
    """Build this rank's replica; returns its number of dense parameters."""
    rep = host.replica = _Replica(host, setup)
    return sum(p.numel() for p in rep.model.parameters())


def drop_trainer(host: RunHost) -> None:
    host.replica = None


def model_state(host: RunHost) -> dict[str, torch.Tensor]:
    """This rank's dense weights (identical on every rank)."""
    rep = _replica(host)
    return {k: v.detach().clone() for k, v in rep.model.state_dict().items()}


def dense_checkpoint(host: RunHost) -> dict[str, Any]:
    """This rank's dense model and optimizer state and its torch RNG state, for a checkpoint."""
    rep = _replica(host)
    return {
        "model": {k: v.detach().clone() for k, v in rep.model.state_dict().items()},
        "optimizer": copy.deepcopy(rep.opt.state_dict()),
        "rng": torch.get_rng_state(),
    }


def load_dense_checkpoint(
    host: RunHost, model: dict, optimizer: dict, rng: list[torch.Tensor]
) -> None:
    """Restore a checkpoint's dense state into this rank's replica. The learning rate and
    weight decay stay this run's (a resume may change them); RNG states only come back when
    the worker count is unchanged."""
    rep = _replica(host)
    comm = host.require_comm()
    rep.model.load_state_dict(model)
    rep.opt.load_state_dict(optimizer)
    for group in rep.opt.param_groups:
        group["lr"], group["weight_decay"] = rep.setup.lr, rep.setup.weight_decay
    if len(rng) == comm.world_size:
        torch.set_rng_state(rng[comm.rank])


def train_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    exchange: Exchange,
    lookup_fn: LookupFn,
    apply_fn: Callable[[torch.Tensor, torch.Tensor], None],
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor],
    *,
    global_size: int,
    lr: float | None,
    grad_clip_norm: float | None,
    pooling: BagPooling | None,
    times: dict[str, float],
    seen: PassKeys | None = None,
    columns: torch.Tensor | None = None,
) -> float:
    """One synchronous mini-batch step of this rank; returns the summed loss of its share.

    ``batch`` is ``(dense, keys, offsets, labels)`` (see :meth:`WorkerExamples.batch`); the
    loss is the mean over the whole global batch of ``global_size`` examples. Seconds per
    stage are added to ``times``; ``seen`` keeps the batch's routed keys (the pass's least
    network traffic is counted from them).
    """
    dense, keys, offsets, labels = batch
    t0 = time.perf_counter()
    routing, leaf = pull_batch(exchange, lookup_fn, keys)
    if seen is not None:
        seen.add(routing.keys, routing.send_counts)
    t1 = time.perf_counter()
    logits = model(dense, sparse_input(leaf, routing, offsets, pooling, columns))
    loss = F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
    opt.zero_grad(set_to_none=False)
    (loss / global_size).backward()
    t2 = time.perf_counter()
    grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
    exchange.push_grads(routing, grad, apply_fn)
    t3 = time.perf_counter()
    exchange.allreduce_dense(model)
    if grad_clip_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip_norm)
    if lr is not None:
        for group in opt.param_groups:
            group["lr"] = lr
    opt.step()
    t4 = time.perf_counter()
    times["pull"] = times.get("pull", 0.0) + t1 - t0
    times["forward_backward"] = times.get("forward_backward", 0.0) + t2 - t1
    times["push"] = times.get("push", 0.0) + t3 - t2
    times["dense_sync_step"] = times.get("dense_sync_step", 0.0) + t4 - t3
    return float(loss.detach())


def train_pass(
    host: RunHost,
    batches: Batches,
    position: int,
    admit: KeyAdmission,
    part: pd.DataFrame,
    keys: pd.DataFrame,
) -> RankPassResult:
    """Train this rank's share of every global batch of one pass (``part``: its examples;
    ``position``: the pass's place in the run's schedule), first admitting the pass's new
    keys (``keys``: this rank's owner partition) when ``admit`` says so."""
    rep = _replica(host)
    setup, model, ex = rep.setup, rep.model, rep.exchange
    admit_s: float | None = None
    admission: dict[str, int] = {}
    if admit.admits:  # before any lookup: a key held back gets no row in this pass
        t = time.perf_counter()
        admission = host.require_shards().admit(admit.table, keys)
        admit_s = time.perf_counter() - t
    B, n, nb = batches.batch_size, batches.num_examples, batches.num_batches
    data = WorkerExamples.from_frame(part, setup.schema, B, nb)
    comm = host.require_comm()
    comm.traffic.take()  # the pass's bytes only (an evaluation's lookups are not counted)
    seen = PassKeys()
    lrs = batches.lrs
    times: dict[str, float] = defaultdict(float)
    losses: list[float] = []
    loss_sum = 0.0
    model.train()
    for b in range(nb):
        host.check_open()  # a driver that left stops the pass here, not at its end
        value = train_step(
            model,
            rep.opt,
            ex,
            rep.lookup,
            rep.apply,
            data.batch(b),
            global_size=min(B, n - b * B),
            lr=lrs[b],
            grad_clip_norm=setup.grad_clip_norm,
            pooling=rep.pooling,
            times=times,
            seen=seen,
            columns=rep.columns,
        )
        rep.step += 1
        loss_sum += value
        losses.append(value)
        if host.rank == 0:
            report_batches(setup.run_id, b + 1, nb)  # the driver's progress bar
    return RankPassResult(
        rank=host.require_rank(),
        examples=data.num_examples,
        loss_sum=loss_sum,
        batch_loss_sums=losses,
        seconds=dict(times),
        network=_pass_traffic(host, rep, seen, position, nb),
        admit_s=admit_s,
        admission=admission,
    )


def _pass_traffic(
    host: RunHost, rep: _Replica, seen: PassKeys, position: int, batches: int
) -> RankTraffic:
    """This rank's network figures of the pass it just trained (see the module docstring)."""
    comm = host.require_comm()
    moved = comm.traffic.take()
    dense = sum(p.numel() for p in rep.model.parameters() if p.requires_grad)
    return RankTraffic(
        sent={k: s for k, (s, _) in moved.items()},
        received={k: r for k, (_, r) in moved.items()},
        owners=seen.by_owner(comm.world_size),
        row_bytes=_mean_row_bytes(rep.setup),
        dense_bytes=dense * 4,
        batches=batches,
        routed=take_routed(host.token, position, host.addresses[host.require_rank()]),
    )


def _mean_row_bytes(setup: TrainSetup) -> int:
    """Bytes of a row or gradient on the wire (float32): with several tables, a field's row
    on average (the figure prices unique keys, whatever their table)."""
    if not setup.several_tables:
        return setup.layout.embedding_dim * 4
    widths = setup.field_widths
    return round(4 * sum(widths) / len(widths))


def eval_pass(host: RunHost, batches: Batches, part: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Predicted click probabilities and labels of this rank's holdout rows, through
    read-only lookups (no row is inserted anywhere)."""
    rep = _replica(host)
    setup, model, ex = rep.setup, rep.model, rep.exchange
    data = WorkerExamples.from_frame(part, setup.schema, batches.batch_size, batches.num_batches)
    preds = []
    model.eval()

    def lookup(keys: torch.Tensor) -> torch.Tensor:
        return rep.lookup(keys, read_only=True)

    with torch.no_grad():
        for b in range(batches.num_batches):
            host.check_open()
            dense, keys, offsets, _ = data.batch(b)
            logits, _, _ = batch_forward(
                model, ex, lookup, dense, keys, offsets, rep.pooling, rep.columns
            )
            preds.append(torch.sigmoid(logits))
    model.train()
    pred = torch.cat(preds).numpy() if preds else np.zeros(0, np.float32)
    return pred, data.labels.numpy()

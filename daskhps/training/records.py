"""The typed records of a pass, from what each rank gets to the line in ``metrics.jsonl``.

::

    Batches, KeyAdmission ──► every rank's mini-batch loop (train_pass, eval_pass)
    RankPassResult ◄── each rank, once its share of the pass is trained
    PassRecord: the ranks' results, staging, evaluation, tiers and timings of one pass;
                one line of metrics.jsonl (to_json), the record a checkpoint keeps
    RunResult: every pass's line, the final evaluation and dense weights, the restarts,
               the run's model and why it stopped; summary.json
    tier_summary: a pass's tier figures (hit rates, store traffic, resident bytes)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daskhps.monitor.network import RankTraffic, network_record

__all__ = [
    "Batches",
    "KeyAdmission",
    "PassRecord",
    "RankPassResult",
    "RunResult",
    "tier_summary",
]


@dataclass(frozen=True)
class Batches:
    """How one pass (or holdout chunk) is cut into global mini-batches, for every rank.

    ``lrs`` holds one learning rate per batch (the schedule's); empty for evaluation.
    """

    batch_size: int  # global
    num_batches: int
    num_examples: int = 0
    lrs: tuple[float, ...] = ()


@dataclass(frozen=True)
class KeyAdmission:
    """Whether a rank's training call first decides which of the pass's new keys get rows
    (``admits``: some table has an admission rule, docs/table.md), inside the call rather
    than in one of its own: each call costs every rank a round trip to the scheduler, more
    than the work itself on a small pass.

    ``table``: the table the pass's keys belong to; None for several tables (each key to its
    own, as :meth:`~daskhps.distributed.WorkerShards.split` says).
    """

    table: str | None
    admits: bool


@dataclass(frozen=True)
class RankPassResult:
    """What one rank's :func:`~daskhps.training.worker.train_pass` returns.

    ``admit_s``: the seconds its admission took, outside ``seconds`` (the batches' own);
    None where the run admits every key. ``admission``: the keys it admitted and held back.
    """

    rank: int
    examples: int
    loss_sum: float
    batch_loss_sums: list[float]
    seconds: dict[str, float]
    network: RankTraffic = field(default_factory=RankTraffic)
    admit_s: float | None = None
    admission: dict[str, int] = field(default_factory=dict)


@dataclass
class PassRecord:
    """One pass of a run, as ``metrics.jsonl`` and the checkpoint's ``state.json`` keep it.

    ``pass_number`` counts from 1 over the whole schedule (the passes done after it),
    ``pass_in_epoch`` from 1 within the epoch's plan, ``epoch`` from 1.
    """

    pass_number: int
    pass_in_epoch: int
    examples: int
    examples_per_s: float
    train_loss: float
    batch_losses: list[float]
    rows_staged: int
    staged_from: dict[str, int]
    worker_seconds: dict[str, float]
    eval: dict[str, float] | None = None
    tiers: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    epoch: int = 0
    bad_rows_skipped: dict[str, Any] = field(default_factory=dict)
    admission: dict[str, int] = field(default_factory=dict)  # with table.admission only
    expiry: dict[str, Any] = field(default_factory=dict)  # passes that end a day, with expiry
    network: dict[str, Any] = field(default_factory=dict)  # bytes between ranks, by kind

    @classmethod
    def of_ranks(
        cls,
        outs: list[RankPassResult],
        *,
        pass_number: int,
        pass_in_epoch: int,
        batches: Batches,
        train_seconds: float,
        rows_staged: int,
        staged_from: dict[str, int],
    ) -> PassRecord:
        """The training part of a pass's record, from every rank's result (losses are the
        ranks' sums over the global batch's examples) and its staging. ``train_seconds``:
        the training call's, of which the keys' admission (as long as its slowest rank: the
        ranks wait for each other at the first batch) is set apart in ``seconds``."""
        B, n = batches.batch_size, batches.num_examples
        admits = outs[0].admit_s is not None
        admit = max(o.admit_s or 0.0 for o in outs)
        train = max(train_seconds - admit, 0.0)
        admission = {k: sum(o.admission[k] for o in outs) for k in outs[0].admission}
        return cls(
            pass_number=pass_number,
            pass_in_epoch=pass_in_epoch,
            examples=n,
            examples_per_s=n / train if train else 0.0,
            train_loss=sum(o.loss_sum for o in outs) / n,
            batch_losses=[
                sum(o.batch_loss_sums[b] for o in outs) / min(B, n - b * B)
                for b in range(batches.num_batches)
            ],
            rows_staged=rows_staged,
            staged_from=staged_from,
            worker_seconds={k: max(o.seconds.get(k, 0.0) for o in outs) for k in outs[0].seconds},
            network=network_record([o.network for o in outs]),
            seconds={"train": train, "admit": admit} if admits else {"train": train},
            admission=admission,
        )

    @property
    def auc(self) -> float | None:
        return self.eval.get("auc") if self.eval is not None else None

    def to_json(self) -> dict[str, Any]:
        """The ``metrics.jsonl`` line (``eval`` only when the pass was evaluated)."""
        out: dict[str, Any] = {
            "pass": self.pass_number,
            "pass_in_epoch": self.pass_in_epoch,
            "examples": self.examples,
            "examples_per_s": self.examples_per_s,
            "train_loss": self.train_loss,
            "batch_losses": self.batch_losses,
            "rows_staged": self.rows_staged,
            "staged_from": self.staged_from,
            "worker_seconds": self.worker_seconds,
        }
        if self.eval is not None:
            out["eval"] = self.eval
        out.update(
            tiers=self.tiers,
            seconds=self.seconds,
            epoch=self.epoch,
            bad_rows_skipped=self.bad_rows_skipped,
        )
        if self.admission:
            out["admission"] = self.admission
        if self.expiry:
            out["expiry"] = self.expiry
        if self.network:
            out["network"] = self.network
        return out


@dataclass
class RunResult:
    """What a finished run leaves behind (also written to ``summary.json``)."""

    run_dir: Path
    passes: list[dict[str, Any]] = field(default_factory=list)
    final_eval: dict[str, float] = field(default_factory=dict)
    dense_state: dict[str, Any] = field(default_factory=dict)
    initial_eval: dict[str, float] = field(default_factory=dict)  # with eval_before
    restarts: list[dict[str, Any]] = field(default_factory=list)  # automatic, after lost workers
    # a resume found the run finished (nothing trained, nothing written): the line saying so
    complete: str | None = None
    model: dict[str, Any] | None = None  # the run's model (training.watch.Best); None: its last
    stopped: dict[str, Any] | None = None  # why it ended before its schedule (watch.Stop)

    @property
    def model_eval(self) -> dict[str, float]:
        """The holdout evaluation of the run's model: its best pass's, else the final one."""
        done = (self.model or {}).get("passes_done")
        for rec in self.passes if done is not None else ():
            if rec.get("pass") == done and rec.get("eval"):
                return dict(rec["eval"])
        return dict(self.final_eval)

    @property
    def pass_losses(self) -> list[float]:
        return [p["train_loss"] for p in self.passes]


def tier_summary(stats: list[dict[str, Any]], tables: list[str]) -> dict[str, Any]:
    """Hit rates and store traffic of the run's tables, summed over tables and workers, and
    the tables' resident bytes on each worker (tiers with their indexes, and the stores' key
    indexes)."""
    rows_from: dict[str, int] = {}
    store_read = store_written = 0
    resident = []
    for s in stats:
        here = 0
        for t in (s["tables"][name] for name in tables):
            here += int(
                t.get("device", {}).get("bytes", 0)
                + t.get("host", {}).get("bytes", 0)
                + t.get("store", {}).get("index_bytes", 0)
            )
            for k, v in t.get("rows_from", {}).items():
                rows_from[k] = rows_from.get(k, 0) + int(v)
            store_read += int(t.get("store", {}).get("rows_read", 0))
            store_written += int(t.get("store", {}).get("rows_written", 0))
        resident.append(here)
    total = sum(rows_from.values())
    return {
        "rows_from": rows_from,
        "hit_rate": {k: (v / total if total else 0.0) for k, v in rows_from.items()},
        "store_rows_read": store_read,
        "store_rows_written": store_written,
        "table_bytes": resident,
    }

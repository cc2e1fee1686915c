"""The whole hierarchy against a plain dict: random lookups, gradient updates, staging,
flushes, commits, reopens and reopens at earlier commits, on a table with tiny tiers so rows
constantly move down to the zarr store and back."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from daskhps.errors import CapacityError
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec
from daskhps.tiers.store import StoreOptions

from .helpers import DictTable, bits

UNIVERSE = torch.arange(-8, 12, dtype=torch.int64) * 1_000_003  # spread over hash buckets
DEVICE_ROWS = 4
key_lists = st.lists(st.integers(0, len(UNIVERSE) - 1), min_size=1, max_size=6).map(
    lambda ix: UNIVERSE[torch.tensor(ix)]
)


class TableMachine(RuleBasedStateMachine):
    optimizer = OptimizerSpec(kind="adagrad", lr=0.1)
    commits = Bundle("commits")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="daskhps-model-"))
        self.spec = TableSpec("model", dim=3, optimizer=self.optimizer, seed=11)
        self.model = DictTable(self.spec)
        self.snapshots: dict[str, dict[int, torch.Tensor]] = {}
        self.latest: str | None = None
        self.pinned: set[int] = set()
        self.n_commits = 0
        self.table = self._open()

    def _open(self, commit: str | None = None) -> EmbeddingTable:
        # host memory: room for about three rows, so rows also travel host -> zarr
        return EmbeddingTable.open(
            self.spec,
            self.dir / "store",
            device_rows=DEVICE_ROWS,
            host_bytes=3 * (self.spec.row_bytes + 64),
            commit=commit,
            store=StoreOptions(snapshot_every=3),
        )

    def teardown(self) -> None:
        self.table.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _fits(self, keys: torch.Tensor) -> bool:
        unpinned = set(keys.tolist()) - self.pinned
        return len(self.pinned) + len(unpinned) <= DEVICE_ROWS

    @initialize()
    def start(self) -> None:
        assert len(self.table.commits()) == 0

    @rule(keys=key_lists, read_only=st.booleans())
    def lookup(self, keys: torch.Tensor, read_only: bool) -> None:
        if not read_only and not self._fits(keys):
            with pytest.raises(CapacityError, match="device tier"):
                self.table.lookup(keys)
            return
        got = self.table.lookup(keys, read_only=read_only)
        assert torch.equal(bits(got), bits(self.model.get(keys)[:, : self.spec.dim]))

    @rule(keys=key_lists, seed=st.integers(0, 2**31))
    def apply_gradients(self, keys: torch.Tensor, seed: int) -> None:
        grads = torch.randn(len(keys), self.spec.dim, generator=torch.Generator().manual_seed(seed))
        if not self._fits(keys):
            with pytest.raises(CapacityError):
                self.table.apply_gradients(keys, grads)
            return
        self.table.apply_gradients(keys, grads)
        self.model.apply_gradients(keys, grads)

    @rule(
        keys=key_lists,
        # Counts near the int32 limit: counting saturates there instead of wrapping.
        counts=st.lists(st.sampled_from([0, 1, 3, 2**30, 2**31 - 1]), min_size=6, max_size=6),
        # One day for all, none, or one per key (0 is NO_DAY: leaves the last day alone).
        days=st.none()
        | st.integers(738_000, 738_010)
        | st.lists(st.sampled_from([0, 738_000, 738_005]), min_size=6, max_size=6),
    )
    def record_seen(
        self, keys: torch.Tensor, counts: list[int], days: int | list[int] | None
    ) -> None:
        n = torch.tensor(counts[: len(keys)], dtype=torch.int64)
        d = torch.tensor(days[: len(keys)], dtype=torch.int32) if isinstance(days, list) else days
        if not self._fits(keys):
            with pytest.raises(CapacityError):
                self.table.record_seen(keys, n, d)
            return
        self.table.record_seen(keys, n, d)
        self.model.record_seen(keys, n, d)

    @rule(keys=key_lists)
    def stage(self, keys: torch.Tensor) -> None:
        if not self._fits(keys):
            with pytest.raises(CapacityError, match="does not fit"):
                self.table.stage(keys)
            return
        report = self.table.stage(keys)
        self.pinned |= set(keys.tolist())
        assert report.pinned == len(self.pinned)

    @rule()
    def unpin(self) -> None:
        self.table.unpin()
        self.pinned.clear()

    @rule()
    def flush(self) -> None:
        self.table.flush()

    @rule(target=commits)
    def commit(self) -> str:
        name = f"c{self.n_commits}"
        self.n_commits += 1
        self.table.commit(name)
        self.snapshots[name] = self.model.snapshot()
        self.latest = name
        return name

    def _reopen(self, commit: str | None) -> None:
        self.table.close()
        self.table = self._open(commit)
        self.pinned.clear()
        name = commit or self.latest
        self.model.rows = (
            {} if name is None else {k: v.clone() for k, v in self.snapshots[name].items()}
        )

    @rule()
    def reopen(self) -> None:
        self._reopen(None)

    @precondition(lambda self: self.latest is not None)
    @rule(name=commits)
    def reopen_at(self, name: str) -> None:
        # Later commits stay on disk and the newest one stays the default for a plain reopen.
        self._reopen(name)

    @invariant()
    def every_row_matches_the_model(self) -> None:
        got = self.table.peek(UNIVERSE)
        assert torch.equal(bits(got), bits(self.model.get(UNIVERSE)))
        assert len(self.table.device_cache) <= DEVICE_ROWS


class AdamMachine(TableMachine):
    optimizer = OptimizerSpec(kind="adam", lr=0.05)


class RowwiseAdagradMachine(TableMachine):
    optimizer = OptimizerSpec(kind="adagrad", lr=0.05, row_wise=True)


class SgdMachine(TableMachine):
    optimizer = OptimizerSpec(kind="sgd", lr=0.5)


def _case(machine: type[TableMachine]) -> type:
    case = machine.TestCase
    case.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
    return case


TestAdagradTable = _case(TableMachine)
TestAdamTable = _case(AdamMachine)
TestRowwiseAdagradTable = _case(RowwiseAdagradMachine)
TestSgdTable = _case(SgdMachine)

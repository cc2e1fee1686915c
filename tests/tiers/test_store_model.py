"""The zarr store against a dict of commits: random upserts (buffered and direct), commits
(names reused), writer reopens at the latest or a kept commit, compactions, ``drop_commits``,
and a reader that ``advance``s from one kept commit to another, on a real store with tiny
chunks and write buffer, so segments, the open segment and snapshots are all exercised.
Deletes remove rows (deletion records, replayed in order with the rows around them). Commits
attach arrays (or keep the ones the state carries), and every state reads back the arrays of
the commit it descends from; no folder of arrays outlives every commit using it.

The model is ``commit name -> {key: row bits}`` plus the writer's uncommitted state. Each
commit also records its lineage (the commits its state descends from): advancing a reader to
a commit that descends from the reader's must succeed; to any other commit it either reaches
that commit's state exactly or raises :class:`StoreMismatchError` and changes nothing.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from daskhps.errors import StoreMismatchError
from daskhps.tiers.store import StoreOptions, StoreReader, open_store

W = 3
UNIVERSE = torch.tensor(
    [-(2**63), -(2**40), -7, -1, 0, 1, 2, 5, 11, 1_000_003, 2**40, 2**63 - 1], dtype=torch.int64
)
BUFFER_ROWS = 4  # upserts of fewer rows are buffered, larger ones become segments at once
NAMES = ["a", "b", "c", "d"]

batches = st.lists(st.integers(0, len(UNIVERSE) - 1), unique=True, min_size=1, max_size=9)
seeds = st.integers(0, 2**32 - 1)


@dataclass(frozen=True)
class Commit:
    name: str
    event: int  # the model's number for this commit; a reused name gets a new one
    lineage: tuple[int, ...]  # events its state descends from, itself included
    rows: dict[int, bytes]
    attached: dict[str, bytes]  # the arrays the commit carries, by name
    erasures: int = 0  # compactions after deletes before it (they drop deletion records)


# What a commit attaches: None keeps the state's arrays, {} drops them.
attachments = st.none() | st.dictionaries(
    st.sampled_from(["counts", "keys"]),
    st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5),
    max_size=2,
)


def row_bits(rows: torch.Tensor) -> list[bytes]:
    return [r.tobytes() for r in rows.contiguous().view(torch.int32).numpy()]


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="daskhps-store-model-"))
        self.writer = self._open(mode="w")
        self.live: dict[int, bytes] = {}  # the writer's state, committed or not
        self.attached: dict[str, bytes] = {}  # the arrays the writer's state carries
        self.lineage: tuple[int, ...] = ()  # commits the writer's state descends from
        self.commits: dict[str, Commit] = {}  # kept commits, oldest first
        self.events = 0
        self.deleted = False  # a delete since the last compaction
        self.erasures = 0
        self.reader: StoreReader | None = None
        self.reader_at: Commit | None = None  # the commit whose state the reader holds

    def _open(self, **kw: Any) -> StoreReader:
        return open_store(
            self.dir / "store",
            name="model/zarr",
            width=W,
            layout={"width": W},
            options=StoreOptions(chunk_rows=2, write_buffer_rows=BUFFER_ROWS, snapshot_every=2),
            **kw,
        )

    def teardown(self) -> None:
        self.writer.close()
        if self.reader is not None:
            self.reader.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- the writer ------------------------------------------------------------------------

    @initialize(writes=st.lists(st.tuples(batches, seeds), min_size=1, max_size=len(NAMES)))
    def first_commits(self, writes: list[tuple[list[int], int]]) -> None:
        """Start from a few commits, each with rows of its own, so that the rules needing
        commits (reopening at one, advancing a reader) run in every example, and a reader
        has older and newer commits to move between."""
        for name, (ix, seed) in zip(NAMES, writes, strict=False):
            self.upsert(ix, seed)
            self.commit(name)

    @rule(ix=batches, seed=seeds)
    def upsert(self, ix: list[int], seed: int) -> None:
        keys = UNIVERSE[torch.tensor(ix)]
        g = torch.Generator().manual_seed(seed)
        rows = torch.randint(-(2**31), 2**31, (len(ix), W), dtype=torch.int32, generator=g)
        rows = rows.view(torch.float32)  # any bits: NaN payloads, denormals, -0.0
        self.writer.upsert(keys, rows)
        self.live.update(zip(keys.tolist(), row_bits(rows), strict=True))

    @rule(ix=batches)
    def delete(self, ix: list[int]) -> None:
        keys = UNIVERSE[torch.tensor(ix)]
        present = [k for k in keys.tolist() if k in self.live]
        assert self.writer.delete(keys) == len(present)
        for k in present:
            del self.live[k]
        self.deleted |= bool(present)

    @rule(name=st.sampled_from(NAMES), attach=attachments)
    def commit(self, name: str, attach: dict[str, list[int]] | None = None) -> None:
        arrays = None
        if attach is not None:
            arrays = {k: np.asarray(v, dtype=np.int32) for k, v in attach.items()}
            self.attached = {k: a.tobytes() for k, a in arrays.items()}
        info = self.writer.commit(name, {"event": self.events + 1}, attach=arrays)
        self.events += 1
        self.lineage = (*self.lineage, self.events)
        self.commits.pop(name, None)  # committing a name again replaces that commit
        self.commits[name] = Commit(
            name, self.events, self.lineage, dict(self.live), dict(self.attached), self.erasures
        )
        assert (info.name, info.rows, info.meta) == (name, len(self.live), {"event": self.events})
        self._forget_reader_if_gone()

    def _continue_from(self, c: Commit | None) -> None:
        self.live = {} if c is None else dict(c.rows)
        self.attached = {} if c is None else dict(c.attached)
        self.lineage = () if c is None else c.lineage

    @rule()
    def reopen_latest(self) -> None:
        self.writer.close()  # uncommitted writes are lost, as in a crash
        self.writer = self._open()
        self._continue_from(list(self.commits.values())[-1] if self.commits else None)

    @precondition(lambda self: self.commits)
    @rule(data=st.data())
    def reopen_at(self, data: st.DataObject) -> None:
        c = data.draw(st.sampled_from(list(self.commits.values())))
        self.writer.close()
        self.writer = self._open(commit=c.name)  # later commits stay
        self._continue_from(c)

    @rule(min_stale=st.sampled_from([0.1, 0.5, 1.0]), merge_below=st.sampled_from([0, 3, 16]))
    def compact(self, min_stale: float, merge_below: int) -> None:
        self.writer.compact(min_stale, merge_below)  # changes no state, drops no commit
        self.erasures += self.deleted  # the deletion records leave the state
        self.deleted = False
        self.no_attached_folder_outlives_its_commits()

    @rule(keep=st.integers(1, len(NAMES)))
    def drop_commits(self, keep: int) -> None:
        names = list(self.commits)
        dropped = self.writer.drop_commits(keep)
        assert [c.name for c in dropped] == names[:-keep]
        for name in names[:-keep]:
            del self.commits[name]
        self._forget_reader_if_gone()
        self.no_attached_folder_outlives_its_commits()

    @rule(name=st.sampled_from(NAMES))
    def drop_named(self, name: str) -> None:
        """A retention rule drops one commit by name, old or new; the others stay."""
        dropped = self.writer.drop_named([name])
        assert [c.name for c in dropped] == ([name] if name in self.commits else [])
        self.commits.pop(name, None)
        self._forget_reader_if_gone()
        self.no_attached_folder_outlives_its_commits()

    # -- a reader that moves to a later commit -------------------------------------------

    def _forget_reader_if_gone(self) -> None:
        """A reader whose commit is no longer kept may lose its files: serving would open
        another, and so does this model."""
        kept = {c.event for c in self.commits.values()}
        if (
            self.reader is not None
            and self.reader_at is not None
            and self.reader_at.event not in kept
        ):
            self.reader.close()
            self.reader, self.reader_at = None, None

    @precondition(lambda self: self.commits)
    @rule(data=st.data(), fresh=st.booleans())
    def advance_reader(self, data: st.DataObject, fresh: bool) -> None:
        """Open a reader at a kept commit (or keep the open one) and advance it to another."""
        kept = list(self.commits.values())
        if self.reader is None or fresh:
            if self.reader is not None:
                self.reader.close()
            c = data.draw(st.sampled_from(kept), label="reader at")
            self.reader, self.reader_at = self._open(mode="r", commit=c.name), c
            self._reads(self.reader, c.rows, c.attached)
        assert self.reader is not None and self.reader_at is not None
        target = data.draw(st.sampled_from(kept), label="advance to")
        before = self.reader_at
        try:
            changed = self.reader.advance(target.name)
        except StoreMismatchError:
            # A commit that extends the reader's is refused only when a compaction between
            # them dropped the deletion records that say which of its keys are gone.
            assert before.event not in target.lineage or target.erasures > before.erasures, (
                "refused a commit that extends its own"
            )
        else:
            self.reader_at = target
            differ = {
                k
                for k in set(before.rows) | set(target.rows)
                if before.rows.get(k) != target.rows.get(k)
            }
            assert differ <= set(changed.tolist()), "a changed row is not among the keys returned"
        assert [c.name for c in self.reader.commits()] == list(self.commits)

    # -- what every store must read --------------------------------------------------------

    @staticmethod
    def _reads(
        store: StoreReader, rows: dict[int, bytes], attached: dict[str, bytes] | None = None
    ) -> None:
        if attached is not None:
            assert store.attached_names == tuple(sorted(attached))
            for name, data in attached.items():
                got_array = store.attached(name)
                assert got_array is not None and got_array.tobytes() == data, name
        got = store.lookup(UNIVERSE)
        keys = UNIVERSE.tolist()
        assert got.found.tolist() == [k in rows for k in keys]
        found = np.flatnonzero(got.found.numpy())
        bits = row_bits(got.rows)
        assert [bits[i] for i in found] == [rows[keys[i]] for i in found]
        assert len(store) == len(rows)

    @invariant()
    def writer_reads_the_model(self) -> None:
        self._reads(self.writer, self.live, self.attached)
        assert [c.name for c in self.writer.commits()] == list(self.commits)

    @invariant()
    def reader_reads_its_commit(self) -> None:
        if self.reader is not None:
            assert self.reader_at is not None
            self._reads(self.reader, self.reader_at.rows, self.reader_at.attached)

    def no_attached_folder_outlives_its_commits(self) -> None:
        """After a collection of garbage (compact, drop_commits), the folders of arrays on
        disk are at most those of the kept commits and the live state."""
        root = self.dir / "store" / "attached"
        on_disk = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        used = {json.loads(m.read_text()).get("attached", {}).get("seq") for m in self._manifests()}
        live = self.writer._chain.attached
        used.add(live.seq if live is not None else None)
        assert {int(n) for n in on_disk} <= used

    def _manifests(self) -> list[Path]:
        return sorted((self.dir / "store" / "commits").glob("*.json"))


StoreMachine.TestCase.settings = settings(max_examples=20, stateful_step_count=25, deadline=None)
TestStoreMachine = StoreMachine.TestCase


def test_the_machine_can_fail() -> None:
    """The invariant notices a row that differs from the model's."""
    m = StoreMachine()
    try:
        m.upsert([0, 1], seed=1)
        m.commit("a")
        m.upsert([0], seed=2)
        m.live[int(UNIVERSE[0])] = b"wrong"
        with pytest.raises(AssertionError):
            m.writer_reads_the_model()
    finally:
        m.teardown()

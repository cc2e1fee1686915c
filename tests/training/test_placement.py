"""Ranks follow their stores: the matching of ranks to the workers whose disks hold them,
against a brute-force model, and the refusal of rival claims."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.distributed.disks import DiskReport, HeldStore
from daskhps.errors import ResumeError
from daskhps.training.placement import _refuse_rival_claims, match_ranks


def _best(holders: list[set[int]], ranks: int) -> int:
    """The model: the most ranks that can go to a holder, trying every assignment."""
    workers = range(len(holders))
    best = 0
    for perm in itertools.permutations(workers, min(ranks, len(holders))):
        best = max(best, sum(1 for r, w in enumerate(perm) if r in holders[w]))
    return best


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 5).flatmap(
        lambda n: st.tuples(
            st.lists(st.sets(st.integers(0, n)), min_size=n, max_size=n), st.just(n)
        )
    )
)
def test_as_many_ranks_as_possible_go_to_a_worker_that_holds_them(
    case: tuple[list[set[int]], int],
) -> None:
    holders, ranks = case
    owner = match_ranks(holders, ranks)
    placed = [w for w in owner if w is not None]
    assert len(placed) == len(set(placed))  # one rank per worker
    assert all(r in holders[w] for r, w in enumerate(owner) if w is not None)
    assert len(placed) == _best(holders, ranks)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.data())
def test_a_shared_disk_keeps_address_order(n: int, data: Any) -> None:
    """Every worker holds every rank (an embedded cluster's shared disk): rank r stays on
    worker r, so a run resumed on one machine keeps the ranks it always had."""
    extra = data.draw(st.sets(st.integers(n, n + 3)))
    assert match_ranks([set(range(n)) | extra] * n, n) == list(range(n))


def test_a_rank_whose_holder_is_taken_moves_along_an_augmenting_path() -> None:
    # worker 0 holds ranks 0 and 1, worker 1 only rank 0: rank 0 must go to worker 1
    assert match_ranks([{0, 1}, {0}], 2) == [1, 0]
    assert match_ranks([{1}, {1}], 2) == [None, 1]  # worker 1 holds its own rank


def _report(address: str, *stores: HeldStore) -> DiskReport:
    return DiskReport(address, "host-" + address, stores=stores)


def test_rival_claims_without_a_recorded_commit_are_refused_naming_both() -> None:
    ckpt: Any = SimpleNamespace(
        name="pass-000002", commit="pass-000002", recorded_commits=lambda: [None, None]
    )
    a = HeldStore(1, "/disk/s/embeddings/rank-1", found="seq 3, 10 rows")
    b = HeldStore(1, "/disk/s/embeddings/rank-1", found="seq 5, 12 rows")
    with pytest.raises(ResumeError, match="worker w1 on host host-w1 and worker w2 on host"):
        _refuse_rival_claims([_report("w1", a), _report("w2", b)], ckpt)
    _refuse_rival_claims([_report("w1", a), _report("w2", a)], ckpt)  # copies of one store
    recorded: Any = SimpleNamespace(**{**vars(ckpt), "recorded_commits": lambda: [None, "id"]})
    _refuse_rival_claims([_report("w1", a), _report("w2", b)], recorded)  # the record decides


def test_fewer_workers_than_lost_ranks_is_one_line_in_the_callers_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1's store is on no disk, the copy holds it, but the one worker left holds rank 0:
    nowhere to restore it onto. The refusal says what the caller could not do and its advice."""
    from pathlib import Path

    from daskhps.training import placement

    ckpt: Any = SimpleNamespace(
        name="pass-000002",
        commit="pass-000002",
        num_workers=2,
        stores_dir=Path("/disk/s"),
        table={"table": "embeddings"},
        table_names=("embeddings",),
        path=Path("/runs/a/checkpoints/pass-000002"),
        recorded_commits=lambda table=None: [None, None],
    )
    replica: Any = SimpleNamespace(url="/shared/copy", has_checkpoint=lambda name: True)
    held = _report("w1", HeldStore(0, "/disk/s/embeddings/rank-0"))
    monkeypatch.setattr(placement, "_survey", lambda *a: [held])
    with pytest.raises(ResumeError) as e:
        placement.place_ranks(
            None, ["w1"], ckpt, replica, "run.yaml", doing="publish v000002 from", advice="fix"
        )
    assert str(e.value) == (
        "cannot publish v000002 from pass-000002 of /runs/a: the store of rank 1 is on none of "
        "the 1 workers' disks, and only 1 worker for its 2 ranks: none is free to restore it "
        "onto from the copy at /shared/copy; fix"
    )

"""Invariant 1 at the table level: tiny tiers (rows go down to zarr and back all the time)
and tiers that hold everything end bit-identical, in every row and its optimizer state."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec

from .helpers import bits, initial_rows

PASSES, BATCHES, PASS_KEYS, BATCH = 6, 5, 48, 32
ALL_KEYS = torch.arange(400, dtype=torch.int64) * 7_777_777 - 10**12


def _workload(table: EmbeddingTable) -> list[torch.Tensor]:
    """A training-like sequence: stage a pass, look up and update batches, commit."""
    gen = torch.Generator().manual_seed(5)
    seen: list[torch.Tensor] = []
    for p in range(PASSES):
        # power-law-ish: low ranks repeat across passes, so rows come back from below
        ranks = (torch.rand(PASS_KEYS * 3, generator=gen) ** 3 * len(ALL_KEYS)).long()
        pass_keys = torch.unique(ALL_KEYS[ranks])[:PASS_KEYS]
        table.stage(pass_keys)
        # The pass's statistics: how often each key occurs, and the pass's day.
        table.record_seen(pass_keys, torch.randint(1, 9, (len(pass_keys),), generator=gen), p)
        for _ in range(BATCHES):
            pick = torch.randint(0, len(pass_keys), (BATCH,), generator=gen)
            keys = pass_keys[pick]  # duplicates on purpose
            emb = table.lookup(keys)
            seen.append(emb.clone())
            grads = torch.tanh(emb * 3.0) + 0.01 * torch.randn(emb.shape, generator=gen)
            table.apply_gradients(keys, grads)
        seen.append(table.lookup(ALL_KEYS[:5], read_only=True).clone())
        table.unpin()
        if p % 2:
            table.commit(f"pass-{p}")
        else:
            table.flush()
    table.commit("end")
    return seen


@pytest.mark.parametrize(
    "optimizer",
    [
        OptimizerSpec(kind="adagrad", lr=0.05),
        OptimizerSpec(kind="adagrad", lr=0.05, row_wise=True),
        OptimizerSpec(kind="adam", lr=0.01),
        OptimizerSpec(kind="sgd", lr=0.1),
    ],
    ids=["adagrad", "rowwise-adagrad", "adam", "sgd"],
)
def test_tiny_tiers_equal_roomy_tiers_bit_for_bit(tmp_path: Path, optimizer: OptimizerSpec) -> None:
    spec = TableSpec("ads", dim=8, optimizer=optimizer, seed=3)
    tiny = EmbeddingTable.open(
        spec, tmp_path / "tiny", device_rows=PASS_KEYS, host_bytes=spec.row_bytes + 64
    )
    roomy = EmbeddingTable.open(
        spec, tmp_path / "roomy", device_rows=len(ALL_KEYS), host_bytes=1 << 26
    )
    with tiny, roomy:
        seen_tiny = _workload(tiny)
        seen_roomy = _workload(roomy)
        assert len(seen_tiny) == len(seen_roomy)
        for a, b in zip(seen_tiny, seen_roomy, strict=True):
            assert torch.equal(bits(a), bits(b))
        # the tiny table really went through the store, the roomy one did not need to
        assert tiny.stats()["rows_from"]["store"] > 0
        assert roomy.stats()["rows_from"]["store"] == 0
        final_tiny, final_roomy = tiny.peek(ALL_KEYS), roomy.peek(ALL_KEYS)
        assert torch.equal(bits(final_tiny), bits(final_roomy))
        # training moved rows away from their initial values (the comparison is not vacuous)
        changed = (bits(final_tiny) != bits(initial_rows(spec, ALL_KEYS))).any(dim=1)
        assert int(changed.sum()) >= PASS_KEYS
    # and the stores on disk agree: reopen both with empty upper tiers
    with (
        EmbeddingTable.open(spec, tmp_path / "tiny", device_rows=8) as a,
        EmbeddingTable.open(spec, tmp_path / "roomy", device_rows=8) as b,
    ):
        assert torch.equal(bits(a.peek(ALL_KEYS)), bits(final_tiny))
        assert torch.equal(bits(b.peek(ALL_KEYS)), bits(final_tiny))

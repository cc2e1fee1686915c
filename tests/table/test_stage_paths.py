"""The table's fast paths against its general ones: staging with repeated keys (dedup by
slot) equals staging their sorted unique keys, and gradients of sorted unique keys (no sort,
no index_add_) equal those of the same keys shuffled and repeated with zero gradients."""

from __future__ import annotations

from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from daskhps.errors import CapacityError
from daskhps.table import EmbeddingTable, OptimizerSpec, TableSpec

from .helpers import DictTable, bits

UNIVERSE = torch.arange(-10, 14, dtype=torch.int64) * 999_983
SPEC = TableSpec("paths", dim=3, optimizer=OptimizerSpec(kind="adagrad", lr=0.1), seed=5)
DEVICE_ROWS = 8
picks = st.lists(st.integers(0, len(UNIVERSE) - 1), min_size=1, max_size=12)


def _open(path: Path) -> EmbeddingTable:
    # tiny tiers: staging moves rows host <-> device <-> zarr
    return EmbeddingTable.open(
        SPEC, path, device_rows=DEVICE_ROWS, host_bytes=3 * (SPEC.row_bytes + 64), mode="w"
    )


def _pinned(table: EmbeddingTable) -> list[int]:
    cache = table.device_cache
    keys = cache.keys()
    return sorted(
        keys[cache.find_slots(keys) >= 0][cache.pinned_at(cache.find_slots(keys))].tolist()
    )


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(picks, st.booleans(), st.integers(0, 2**31)), min_size=1, max_size=6))
def test_staging_repeated_keys_equals_staging_unique_keys(tmp_path_factory, passes) -> None:
    d = tmp_path_factory.mktemp("stage")
    with _open(d / "repeated") as rep, _open(d / "unique") as uni:
        for ix, unpin, seed in passes:
            keys = UNIVERSE[torch.tensor(ix)]
            gen = torch.Generator().manual_seed(seed)
            shuffled = keys[torch.randperm(len(keys), generator=gen)]
            ukeys = torch.unique(keys)
            if len(set(_pinned(uni)) | set(ukeys.tolist())) > DEVICE_ROWS:
                for t, k in ((rep, shuffled), (uni, ukeys)):
                    with pytest.raises(CapacityError, match="does not fit"):
                        t.stage(k)
                continue
            a, b = rep.stage(shuffled), uni.stage(ukeys)
            assert a == b, (a, b)
            assert a.rows == len(ukeys)
            assert _pinned(rep) == _pinned(uni) == sorted(set(_pinned(uni)) | set(ukeys.tolist()))
            grads = torch.randn(len(ukeys), SPEC.dim, generator=gen)
            rep.apply_gradients(ukeys, grads)
            uni.apply_gradients(ukeys, grads)
            if unpin:
                rep.unpin()
                uni.unpin()
        assert torch.equal(bits(rep.peek(UNIVERSE)), bits(uni.peek(UNIVERSE)))


@settings(max_examples=25, deadline=None)
@given(
    st.lists(picks.map(lambda ix: ix[:DEVICE_ROWS]), min_size=1, max_size=5), st.integers(0, 2**31)
)
def test_sorted_unique_gradients_equal_the_general_path(tmp_path_factory, batches, seed) -> None:
    d = tmp_path_factory.mktemp("grads")
    model = DictTable(SPEC)
    gen = torch.Generator().manual_seed(seed)
    with _open(d / "fast") as fast, _open(d / "general") as general:
        for ix in batches:
            ukeys = torch.unique(UNIVERSE[torch.tensor(ix)])
            grads = torch.randn(len(ukeys), SPEC.dim, generator=gen)
            grads[grads.abs() < 0.2] = -0.0  # -0.0 must come out as index_add_ makes it: 0.0
            fast.apply_gradients(ukeys, grads)
            # general: shuffled, each key twice, the second time with a zero gradient
            twice = torch.cat([ukeys, ukeys])
            perm = torch.randperm(len(twice), generator=gen)
            g2 = torch.cat([grads, torch.zeros_like(grads)])
            general.apply_gradients(twice[perm], g2[perm])
            model.apply_gradients(ukeys, grads)
            assert torch.equal(
                bits(fast.lookup(ukeys)), bits(general.lookup(ukeys[[*range(len(ukeys))]]))
            )
        want = bits(model.get(UNIVERSE))
        assert torch.equal(bits(fast.peek(UNIVERSE)), want)
        assert torch.equal(bits(general.peek(UNIVERSE)), want)

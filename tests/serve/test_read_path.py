"""Serving and training read one table through one read path (daskhps.table.read_path).

The same committed rank store is read by a :class:`ServingLookup` and by an
:class:`EmbeddingTable` with caches of the same sizes. Fed the same batches, the two must
return the same bits, count rows from the same places and leave the same keys in each cache;
a change to either side's read path (where host rows go, what is dropped, in which order rows
are placed) fails here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskhps.serve import ServingLookup
from daskhps.table import EmbeddingTable
from daskhps.tiers._slots import SlotCache
from daskhps.tiers.host import rows_for_bytes
from tests.serve.helpers import SPEC, bits, reference_rows, train_commit, version

STORED = 60
# stored keys, then keys no commit holds (they read their initial rows)
UNIVERSE = torch.cat([torch.arange(STORED) * 7919 - 100_000, torch.arange(10) * 31 + 5])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One rank store (the table is one shard) holding the first STORED keys at ``v1``."""
    root = tmp_path_factory.mktemp("one-rank")
    train_commit(root, UNIVERSE[:STORED], "v1", workers=1, seed=3)
    return root


@contextmanager
def _twins(
    root: Path, device_rows: int, host_rows: int, *, full_rows: bool = True
) -> Iterator[tuple[EmbeddingTable, ServingLookup]]:
    # The same byte budget gives both host tiers the same rows (full rows: the same width).
    host_bytes = _bytes_for_rows(host_rows)
    table = EmbeddingTable.open(
        SPEC, root / SPEC.name / "rank-0", device_rows=device_rows, host_bytes=host_bytes
    )
    serving = ServingLookup(
        version(root, "v1", workers=1),
        device_rows=device_rows,
        host_bytes=host_bytes,
        full_rows=full_rows,
    )
    try:
        yield table, serving
    finally:
        serving.close()
        table.close()


def _bytes_for_rows(rows: int) -> int:
    """The smallest host budget that holds ``rows`` whole rows (0 for none)."""
    budget = 0
    while rows and rows_for_bytes(SPEC.width, budget) < rows:
        budget += 8
    return budget


def _resident(cache: SlotCache | None) -> list[int]:
    return [] if cache is None else sorted(cache.keys().tolist())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(
        st.lists(st.integers(0, len(UNIVERSE) - 1), min_size=1, max_size=20), max_size=10
    ),
    device_rows=st.integers(1, 12),
    host_rows=st.integers(0, 12),
)
def test_the_same_batches_read_the_same_rows_from_the_same_places(
    store: Path, batches: list[list[int]], device_rows: int, host_rows: int
) -> None:
    """Tiny LRU caches (rows move device <-> host <-> dropped at every batch): after each
    batch, the same rows, the same counts per source, the same keys in each cache."""
    with _twins(store, device_rows, host_rows) as (table, serving):
        for b in batches:
            keys = UNIVERSE[torch.tensor(b)]  # duplicates allowed; the unique keys must
            keys = keys[torch.isin(keys, keys.unique()[:device_rows])]  # fit training's tier
            trained = table.lookup(keys)  # a training lookup: rows promoted, clean
            served = serving.lookup(keys)
            assert np.array_equal(bits(served[:, : SPEC.dim]), bits(trained))
            assert table.stats()["rows_from"] == serving.stats()["rows_from"]
            assert _resident(table.device_cache) == _resident(serving.device_cache)
            assert _resident(table.host) == _resident(serving.host)
        assert len(table.store) == STORED  # nothing was written: every row stayed clean


@pytest.mark.parametrize("full_rows", [True, False], ids=["full-rows", "embeddings"])
def test_a_mix_of_cached_stored_and_unseen_keys_reads_the_same_bits(
    store: Path, full_rows: bool
) -> None:
    """A read-only table lookup (host read in place, nothing moves) and a serving lookup
    (host rows move up, the batch is cached) give the same rows for keys in the device cache,
    in host memory, only in the store, and in no tier at all."""
    with _twins(store, 8, 16, full_rows=full_rows) as (table, serving):
        for part in UNIVERSE[:40].split(8):  # 8 per batch: the older ones go to host memory
            table.lookup(part)
            serving.lookup(part)
        device = table.device_cache.keys()
        host = table.host.keys() if table.host is not None else device[:0]
        query = torch.cat([device[:5], host[:5], UNIVERSE[40:STORED:4], UNIVERSE[STORED:]])
        query = torch.cat([query, query[:3]])  # and duplicates
        assert len(device) and len(host)
        for cache in (serving.device_cache, serving.host):  # the mix is the same for serving
            assert cache is not None and bool((cache.find_slots(query) >= 0).any())
        peeked = table.peek(query)  # whole rows
        looked = table.lookup(query, read_only=True)
        served = serving.lookup(query)
        width = served.shape[1]
        assert width == (SPEC.width if full_rows else SPEC.dim)
        assert np.array_equal(bits(served), bits(peeked[:, :width]))
        assert np.array_equal(bits(served[:, : SPEC.dim]), bits(looked))
        assert np.array_equal(bits(peeked), bits(reference_rows(version(store, "v1", 1), query)))

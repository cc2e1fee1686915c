"""Shared pytest configuration: the `gpu` marker skips where CUDA is absent; warm clusters
that in-process training runs share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests._clusters import SharedClusters


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_clusters() -> Iterator[SharedClusters]:
    """Warm LocalClusters for in-process runs (tests/_clusters.py), closed at the end."""
    clusters = SharedClusters()
    try:
        yield clusters
    finally:
        clusters.close()

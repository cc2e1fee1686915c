"""Shared pytest configuration: the `gpu` marker skips where CUDA is absent; warm clusters
that in-process training runs share; mypy starts in the background when the suite holds its
check (tests/test_quality.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests._clusters import SharedClusters
from tests.test_quality import Mypy


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.nodeid.endswith("test_quality.py::test_mypy") for item in items):
        Mypy.start()  # in the background, while the tests before it run
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    Mypy.stop()  # a run stopped before test_mypy leaves no mypy behind


@pytest.fixture(scope="session")
def shared_clusters() -> Iterator[SharedClusters]:
    """Warm LocalClusters for in-process runs (tests/_clusters.py), closed at the end."""
    clusters = SharedClusters()
    try:
        yield clusters
    finally:
        clusters.close()

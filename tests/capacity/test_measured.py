"""The peak a worker's memory reached: a transient shorter than the sampling interval counts."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from daskhps.capacity.measured import start_sampling, stop_sampling


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's peak is Linux's")
def test_a_transient_shorter_than_a_sample_is_in_the_peak() -> None:
    # 32 MiB written and unmapped again in a few ms: a 10 ms sampler alone sees each such
    # transient by chance, so missing any of five fails.
    for _ in range(5):
        base = start_sampling()
        block = np.ones(32 << 20, dtype=np.uint8)
        del block
        peak = stop_sampling()
        assert peak - base >= 30 << 20, (base, peak)

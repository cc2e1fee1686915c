"""Worker processes reuse freed blocks: Dask's ``MALLOC_TRIM_THRESHOLD_`` would otherwise map
(and fault in) fresh pages for every tensor of every batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_CHURN = """
import json, resource, sys, torch
from daskhps.distributed._allocator import reuse_freed_memory
applied = reuse_freed_memory() if sys.argv[1] == "tuned" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):  # warm up
    (torch.ones(1 << 18) * 2).sum()
before = faults()
for _ in range(200):  # 1 MiB tensors, allocated and freed as a training step does
    (torch.ones(1 << 18) * 2).sum()
print(json.dumps({"faults": faults() - before, "applied": applied}))
"""


def _churn(mode: str) -> dict:
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"}  # what Dask's nanny sets
    out = subprocess.run(
        [sys.executable, "-c", _CHURN, mode], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuned_allocator_stops_the_page_faults_of_freed_tensors() -> None:
    plain, tuned = _churn("plain"), _churn("tuned")
    assert tuned["applied"] is True
    # Untuned: every 1 MiB tensor is 256 fresh pages (two tensors a round).
    assert plain["faults"] > 200 * 256, plain
    assert tuned["faults"] < 2_000, tuned

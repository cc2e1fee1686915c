"""The per-example step bytes the plan measures: the live-bytes counter against a model of
allocations and frees, and the model's step against what its shapes say."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from daskhps.capacity.activations import PeakLiveBytes, step_bytes
from daskhps.config import RunConfig
from daskhps.models import BUILTIN_MODELS

# One step: allocate a buffer of that many bytes (> 0), or free the i-th live one (<= 0).
_STEPS = st.lists(st.integers(min_value=-8, max_value=4096), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(_STEPS)
def test_peak_matches_a_model_of_allocations_and_frees(steps: list[int]) -> None:
    live: list[torch.Tensor] = []
    sizes: list[int] = []
    peak = now = 0
    with PeakLiveBytes() as counter:
        for step in steps:
            if step > 0:
                live.append(torch.empty(step, dtype=torch.uint8))
                sizes.append(step)
                now += step
                peak = max(peak, now)
            elif live:
                i = -step % len(live)
                del live[i]
                now -= sizes.pop(i)
        torch.empty(0)  # an operation after the last free: the counter sees it
        assert counter.now == now
    assert counter.peak == peak


def test_views_and_preexisting_tensors_are_not_counted() -> None:
    weights = torch.randn(1000)  # made before the block: the plan prices weights apart
    with PeakLiveBytes() as counter:
        x = torch.ones(256)  # 1 KiB
        x.view(16, 16).t()  # views: the same storage
        weights.mul(2)  # 4000 bytes, freed at once
        weights[:500].t()  # views of a tensor made before: nothing allocated
        weights.add_(1)  # in place: nothing allocated
    assert counter.peak == 4000 + 1024


def _config(model: str, options: dict[str, object], dim: int = 16) -> RunConfig:
    return RunConfig.from_dict(
        {
            "run": {"name": "a", "dir": "/nonexistent/a", "quiet": True},
            "data": {"train": {"paths": ["/nonexistent/logs"]}},
            "table": {"dim": dim},
            "model": {"name": model, "options": options},
        },
        source="test",
    )


def test_eval_step_holds_two_layer_outputs_of_a_plain_mlp() -> None:
    # DLRM with a single top layer: the widest tensors alive at once in evaluation are the
    # interaction's pairwise products, [B, F + 1, F + 1] floats, beside its input.
    cfg = _config("dlrm", {"bottom_mlp": [16], "top_mlp": [1]})
    steps = step_bytes(cfg)
    fields = len(cfg.data.schema.categorical_names)
    pairs = 4 * (fields + 1) ** 2
    assert pairs <= steps.eval_per_row <= 4 * pairs
    assert steps.train_per_row > steps.eval_per_row  # backward keeps what eval frees


@pytest.mark.parametrize("model", sorted(BUILTIN_MODELS))
def test_step_bytes_grow_with_the_embedding_width(model: str) -> None:
    narrow = step_bytes(_config(model, {}, dim=8))
    wide = step_bytes(_config(model, {}, dim=64))
    assert wide.train_per_row > narrow.train_per_row > 0
    assert wide.eval_per_row > narrow.eval_per_row > 0
    assert narrow.train(1000) == int(narrow.train_per_row * 1000)

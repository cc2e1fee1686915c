"""Pass settings: how the example stream is cut into passes and global batches."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from daskhps.options import Int, Options, Problem

__all__ = ["SHUFFLE_METHODS", "PassConfig"]

ShuffleMethod = Literal["tasks", "p2p", "disk"]
SHUFFLE_METHODS = (None, "tasks", "p2p", "disk")


class PassConfig(Options):
    """How to plan passes. Nothing here depends on tier sizes. The ``passes`` section of a run
    config is these options and ``epochs``
    (:class:`daskhps.config.training.PassesConfig`)."""

    examples_per_pass: Int = Field(1 << 20, ge=1)
    """Examples per pass (the last may be shorter)."""
    global_batch_size: Int = Field(4096, ge=1)
    """Examples per optimizer step over all workers."""
    max_working_set: Int | None = Field(None, ge=1)
    """Split passes with more unique keys than this, at global-batch boundaries."""
    num_shards: Int = Field(64, ge=1)
    """Virtual shards of the key space (owner = mix(key) % num_shards)."""
    shuffle_examples: bool = False
    """Permute examples within each pass (seeded by the plan seed)."""
    shuffle_method: ShuffleMethod | None = None
    """Dask shuffle of the keys to their owners; null: Dask chooses."""

    @model_validator(mode="after")
    def _batch_within_pass(self) -> PassConfig:
        if self.global_batch_size > self.examples_per_pass:
            raise Problem(
                "global_batch_size",
                f"{self.global_batch_size} must not exceed passes.examples_per_pass "
                f"({self.examples_per_pass})",
            )
        return self

"""The ``checkpoint`` section: how often a run checkpoints, how many it keeps, and how often a
checkpoint is a full base instead of a delta (docs/checkpoints.md)."""

from __future__ import annotations

from typing import Any

import fsspec
from pydantic import Field, field_validator

from daskhps.options import Ctx, Int, Options, Problem, validate

__all__ = ["CheckpointConfig"]


class CheckpointConfig(Options):
    """Checkpoint after every ``every_passes`` passes (0: never; the last pass always, unless
    0), keep the newest ``keep``, and make every ``full_every``-th one a full base (the table
    stores compacted, a full index snapshot); the others are deltas (rows written since)."""

    every_passes: Int = Field(1, ge=0)
    """Checkpoint every N passes and after the last; 0: never."""
    keep: Int = Field(3, ge=1)
    """Keep the newest N checkpoints (older ones are deleted)."""
    full_every: Int = Field(4, ge=1)
    """Every Nth checkpoint is a full base; others are deltas."""
    replicate_to: str | None = Field(None, min_length=1)
    """A second copy of each checkpoint and its stores: a shared folder or an fsspec URL
    (file://, s3://, ...); null: none."""

    @field_validator("replicate_to")
    @classmethod
    def _a_known_protocol(cls, url: str | None) -> str | None:
        if url is not None:
            protocol = url.split("://", 1)[0] if "://" in url else "file"
            try:
                fsspec.get_filesystem_class(protocol)
            except (ImportError, ValueError) as e:
                raise Problem("", f"cannot use {url!r}: {str(e).splitlines()[0]}") from None
        return url

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> CheckpointConfig:
        return validate(cls, d, ctx, "checkpoint")

    @property
    def enabled(self) -> bool:
        return self.every_passes > 0

    def due(self, passes_done: int, last: bool) -> bool:
        """Whether to checkpoint once ``passes_done`` passes of the run are done."""
        return self.enabled and (last or passes_done % self.every_passes == 0)

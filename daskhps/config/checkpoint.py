"""The ``checkpoint`` section: how often a run checkpoints, how many it keeps, and how often a
checkpoint is a full base instead of a delta (docs/checkpoints.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from daskhps.config._context import Ctx

__all__ = ["CheckpointConfig"]


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoint after every ``every_passes`` passes (0: never; the last pass always, unless
    0), keep the newest ``keep``, and make every ``full_every``-th one a full base (the table
    stores compacted, a full index snapshot); the others are deltas (rows written since)."""

    every_passes: int = 1
    keep: int = 3
    full_every: int = 4

    KEYS: ClassVar[tuple[str, ...]] = ("every_passes", "keep", "full_every")

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> CheckpointConfig:
        p = "checkpoint"
        d = ctx.mapping(d, cls.KEYS, p)
        return cls(
            every_passes=ctx.get(d, p, "every_passes", int, cls.every_passes, minimum=0),
            keep=ctx.get(d, p, "keep", int, cls.keep, minimum=1),
            full_every=ctx.get(d, p, "full_every", int, cls.full_every, minimum=1),
        )

    @property
    def enabled(self) -> bool:
        return self.every_passes > 0

    def due(self, passes_done: int, last: bool) -> bool:
        """Whether to checkpoint once ``passes_done`` passes of the run are done."""
        return self.enabled and (last or passes_done % self.every_passes == 0)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.KEYS}

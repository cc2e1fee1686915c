"""The ``run`` section: name, run directory, seed, verbosity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from daskhps.config._context import Ctx

__all__ = ["RunSection"]


@dataclass(frozen=True)
class RunSection:
    """``name`` labels the run and names its directory ``dir`` (default ``runs/<name>``), which
    holds checkpoints, metrics.jsonl, summary.json and logs. ``seed`` is the default of every
    other seed (table initialisation, holdout split, plan)."""

    name: str = "daskhps"
    dir: str = "runs/daskhps"
    seed: int = 0
    quiet: bool = False

    KEYS: ClassVar[tuple[str, ...]] = ("name", "dir", "seed", "quiet")

    @classmethod
    def parse(cls, d: Any, ctx: Ctx, default_name: str = "daskhps") -> RunSection:
        p = "run"
        d = ctx.mapping(d, cls.KEYS, p)
        name = ctx.get(d, p, "name", str, default_name)
        if not name or not all(c.isalnum() or c in "-_." for c in name) or name[0] == ".":
            raise ctx.error(
                "run.name", f"{name!r}: use letters, digits, '-', '_' or '.' (it names a folder)"
            )
        run_dir = ctx.get(d, p, "dir", (str, type(None)), None) or f"runs/{name}"
        return cls(
            name=name,
            dir=run_dir,
            seed=ctx.get(d, p, "seed", int, 0, minimum=0),
            quiet=ctx.get(d, p, "quiet", bool, False),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dir": self.dir, "seed": self.seed, "quiet": self.quiet}

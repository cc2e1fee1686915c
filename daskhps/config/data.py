"""The ``data`` section: training logs (files, or synthetic logs to generate), schema, bad-row
policy, holdout and dataframe backend."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, ValidationInfo, field_validator, model_validator

from daskhps.config._context import Ctx, size_bytes
from daskhps.config._options import Int, Options, Problem, shown, validate
from daskhps.data.backend import BACKENDS
from daskhps.data.badrows import BadRowPolicy
from daskhps.data.schema import Schema, criteo_schema, load_schema
from daskhps.data.source import SUCCESS, DataSource
from daskhps.data.synthetic import GeneratorConfig
from daskhps.errors import ConfigError

__all__ = ["DataConfig", "GenerateConfig", "HoldoutConfig"]

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
TRAIN_KEYS = ("paths", "days", "require_complete")


class GenerateConfig(GeneratorConfig):
    """Synthetic Criteo-format logs written to ``out`` (or reused when ``out`` already holds
    every day, complete, generated with the same settings): the generator's options, and
    ``workers`` generator threads."""

    out: str = Field("runs/daskhps/data", json_schema_extra=shown("path", "`<run.dir>/data`"))
    """Folder of the generated logs."""
    workers: Int | None = Field(None, ge=1)
    """Generator threads (null: all cores)."""

    @model_validator(mode="before")
    @classmethod
    def _logs_in_the_run(cls, data: Any, info: ValidationInfo) -> Any:
        # The logs default to (and null means) <run.dir>/data.
        context = info.context or {}
        if data is None:
            data = {}
        if isinstance(data, dict) and data.get("out") is None and "run_dir" in context:
            return {**data, "out": f"{context['run_dir']}/data"}
        return data

    @property
    def generator(self) -> GeneratorConfig:
        """What to generate (everything but where and with how many threads)."""
        return GeneratorConfig(**{k: getattr(self, k) for k in GeneratorConfig.model_fields})

    @property
    def day_range(self) -> tuple[str, str]:
        names = self.generator.day_names()
        return names[0], names[-1]

    def ready(self) -> bool:
        """True when ``out`` holds every day, complete, generated with these settings.

        Raises :class:`ConfigError` when ``out`` holds logs generated with other settings:
        regenerating over them could leave stale parts behind, and deleting them is the user's
        call. Settings that differ in ``days`` alone are the same logs, longer or shorter:
        each part is a function of (seed, day, part), so generating more days rewrites the
        earlier ones as they were (how ``daskhps retrain`` gets a new day), and fewer days are
        ready once their days are complete (readers take only the configured days).
        """
        meta = Path(self.out) / "generation.json"
        if not meta.exists():
            return False
        try:
            found = json.loads(meta.read_text())["config"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        want = self.generator.to_dict()
        differ = sorted(k for k in want if found.get(k) != want[k])
        if differ == ["days"] and isinstance(found.get("days"), int):
            differ = []  # the same logs with more or fewer days (see above)
        if differ:
            raise ConfigError(
                f"data.generate.out: {self.out} holds logs generated with other settings "
                f"({', '.join(f'{k}={found.get(k)!r}' for k in differ)}); delete the folder "
                "or choose another data.generate.out"
            )
        return all(
            (Path(self.out) / f"day={day}" / SUCCESS).exists() for day in self.generator.day_names()
        )

    def ensure(self, scheduler: Any = "threads", progress: bool = False) -> bool:
        """Generate the logs unless :meth:`ready`; True when it generated them."""
        if self.ready():
            return False
        from daskhps.data.synthetic import generate

        generate(self.generator, self.out, scheduler, self.workers, progress)
        return True


class HoldoutConfig(Options):
    """Evaluation rows held out of training: one ``day`` (``last`` or ``YYYY-MM-DD``) of a
    day-partitioned log, or a ``fraction`` of rows chosen by ``seed`` (never both)."""

    day: str | None = Field(
        None, json_schema_extra=shown("`last`, YYYY-MM-DD or null", "one of day, fraction")
    )
    """Hold out one day (not trained on)."""
    fraction: float | None = Field(
        None, gt=0.0, lt=1.0, json_schema_extra=shown(default="one of day, fraction")
    )
    """Hold out this fraction of rows."""
    seed: Int = Field(0, ge=0, json_schema_extra=shown(default="`run.seed`"))
    """Seed of the fraction split."""

    @model_validator(mode="before")
    @classmethod
    def _seed_of_the_run(cls, data: Any, info: ValidationInfo) -> Any:
        context = info.context or {}
        if isinstance(data, dict) and data.get("seed") is None and "seed" in context:
            return {**data, "seed": context["seed"]}
        return data

    @field_validator("day")
    @classmethod
    def _a_day(cls, day: str | None) -> str | None:
        if day is not None and day != "last" and not _DATE.match(day):
            raise Problem("", f"expected last or YYYY-MM-DD, got {day!r}")
        return day

    @model_validator(mode="after")
    def _day_or_fraction(self) -> HoldoutConfig:
        if (self.day is None) == (self.fraction is None):
            raise Problem("", "give exactly one of day (last or YYYY-MM-DD) or fraction")
        return self


def _schema(spec: Any, ctx: Ctx) -> Schema:
    p = "data.schema"
    if isinstance(spec, Mapping):
        with ctx.section(p):
            return Schema.from_dict(spec, ctx.source)
    if not isinstance(spec, str):
        raise ctx.error(p, f"expected a builtin name (criteo), a file or a mapping; got {spec!r}")
    # A schema file is looked up beside the config file first, then from the current folder;
    # a builtin name stays the builtin unless it looks like a file (load_schema).
    base = Path(ctx.source).parent if ctx.source.endswith((".yaml", ".yml")) else None
    with ctx.section(p):
        return load_schema(spec, base)


BLOCK_SIZE = 64 << 20  # bytes of plain text a partition reads: tens of MB parse in ~a second


def _block_size(d: Mapping[str, Any], ctx: Ctx) -> int | None:
    key = "data.block_size"
    value = ctx.get(d, "data", "block_size", (int, str, type(None)), BLOCK_SIZE)
    if value is None:
        return None
    value = size_bytes(ctx, key, value, "bytes (67108864), a size ('64MiB') or null")
    if value < 1 << 12:
        raise ctx.error(key, f"{value} bytes is below 4 KiB; blocks that small cost more to plan")
    return int(value)


@dataclass(frozen=True)
class DataConfig:
    """Where training rows come from (``train`` files or ``generate``), how they are read and
    which rows are held out for evaluation. :attr:`source` is what the reader takes."""

    train: DataSource | None = None
    generate: GenerateConfig | None = None
    schema: Schema = field(default_factory=criteo_schema)
    bad_rows: BadRowPolicy = field(default_factory=BadRowPolicy)
    holdout: HoldoutConfig | None = None
    backend: str = "auto"
    block_size: int | None = BLOCK_SIZE  # None: every file is one partition

    KEYS: ClassVar[tuple[str, ...]] = (
        "train",
        "generate",
        "schema",
        "bad_rows",
        "holdout",
        "backend",
        "block_size",
    )

    @classmethod
    def parse(cls, d: Any, ctx: Ctx, run_dir: str, seed: int) -> DataConfig:
        p = "data"
        d = ctx.mapping(d, cls.KEYS, p)
        has_schema = d.get("schema") is not None
        schema = _schema(d["schema"], ctx) if has_schema else criteo_schema()
        bad_rows = validate(BadRowPolicy, d.get("bad_rows"), ctx, f"{p}.bad_rows")
        train_raw, gen_raw = d.get("train"), d.get("generate")
        if (train_raw is None) == (gen_raw is None):
            raise ctx.error(
                p, "give exactly one of train (paths of click logs) or generate (synthetic logs)"
            )
        train = generate = None
        if train_raw is not None:
            raw = ctx.mapping(train_raw, TRAIN_KEYS, f"{p}.train")
            with ctx.section(f"{p}.train"):
                src = DataSource.from_dict(raw, ctx.source, f"{p}.train")
            train = dataclasses.replace(src, schema=schema, bad_rows=bad_rows)
        else:
            generate = validate(GenerateConfig, gen_raw, ctx, f"{p}.generate", {"run_dir": run_dir})
            if schema != criteo_schema():
                raise ctx.error(
                    f"{p}.schema", "generated logs are Criteo-format; leave schema out (criteo)"
                )
        holdout = None
        if d.get("holdout") is not None:
            holdout = validate(HoldoutConfig, d["holdout"], ctx, f"{p}.holdout", {"seed": seed})
        if generate is not None and holdout is not None and holdout.day is not None:
            days = generate.generator.day_names()
            if holdout.day != "last" and holdout.day not in days:
                raise ctx.error(
                    f"{p}.holdout.day", f"{holdout.day} is not a generated day ({', '.join(days)})"
                )
            if len(days) < 2:
                raise ctx.error(
                    f"{p}.holdout.day",
                    "holding out the only generated day leaves nothing to train on; "
                    "set data.generate.days >= 2 or use holdout.fraction",
                )
        return cls(
            train=train,
            generate=generate,
            schema=schema,
            bad_rows=bad_rows,
            holdout=holdout,
            backend=ctx.get(d, p, "backend", str, "auto", choices=BACKENDS),
            block_size=_block_size(d, ctx),
        )

    @property
    def source(self) -> DataSource:
        """The training files: ``train``, or the complete generated days under ``out``."""
        if self.train is not None:
            return self.train
        assert self.generate is not None
        return DataSource(
            paths=(self.generate.out,),
            schema=self.schema,
            days=self.generate.day_range,  # never stale days of an earlier, longer generation
            require_complete=True,
            bad_rows=self.bad_rows,
        )

    def to_dict(self) -> dict[str, Any]:
        train = None
        if self.train is not None:
            t = self.train
            train = {
                "paths": list(t.paths),
                "days": list(t.days) if t.days else None,
                "require_complete": t.require_complete,
            }
        schema: Any = "criteo" if self.schema == criteo_schema() else self.schema.to_dict()
        return {
            "train": train,
            "generate": self.generate.to_dict() if self.generate else None,
            "schema": schema,
            "bad_rows": self.bad_rows.to_dict(),
            "holdout": self.holdout.to_dict() if self.holdout else None,
            "backend": self.backend,
            "block_size": self.block_size,
        }

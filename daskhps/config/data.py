"""The ``data`` section: training logs (files, or synthetic logs to generate), schema, bad-row
policy, holdout and dataframe backend."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import (
    BeforeValidator,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from daskhps import storage
from daskhps.data.backend import Backend
from daskhps.data.badrows import BadRowPolicy
from daskhps.data.generation import generation_record
from daskhps.data.schema import Schema, criteo_schema, schema_at
from daskhps.data.source import SUCCESS, DataSource, TrainLogs
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.errors import ConfigError
from daskhps.options import (
    SIZE_JSON,
    Ctx,
    Int,
    Options,
    Problem,
    parse_size,
    shown,
    validate,
)

__all__ = ["DataConfig", "GenerateConfig", "HoldoutConfig"]

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


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
        record = generation_record(self.out)
        found = record.get("config") if isinstance(record, dict) else None
        if not isinstance(found, dict):
            return False
        want = self.generator.to_dict()
        # A setting the file lacks was generated at its default: logs from before it existed.
        default = {k: f.default for k, f in GeneratorConfig.model_fields.items()}
        found = {k: found.get(k, default[k]) for k in want}
        differ = sorted(k for k in want if found[k] != want[k])
        if differ == ["days"] and isinstance(found.get("days"), int):
            differ = []  # the same logs with more or fewer days (see above)
        if differ:
            raise ConfigError(
                f"data.generate.out: {self.out} holds logs generated with other settings "
                f"({', '.join(f'{k}={found.get(k)!r}' for k in differ)}); delete the folder "
                "or choose another data.generate.out"
            )
        return all(
            storage.exists(f"{self.out.rstrip('/')}/day={day}/{SUCCESS}")
            for day in self.generator.day_names()
        )

    def ensure(self, scheduler: Any = "threads", progress: bool = False) -> bool:
        """Generate the logs unless :meth:`ready`; True when it generated them."""
        if self.ready():
            return False
        generate(self.generator, self.out, scheduler, self.workers, progress)
        return True


class HoldoutConfig(Options):
    """Evaluation rows held out of training: one ``day`` (``last`` or ``YYYY-MM-DD``) of a
    day-partitioned log, or a ``fraction`` of rows chosen by ``seed``; or, ``progressive``,
    the training rows themselves, scored before the run trains on them (exactly one)."""

    day: str | None = Field(
        None,
        json_schema_extra=shown("`last`, YYYY-MM-DD or null", "one of day, fraction, progressive"),
    )
    """Hold out one day (not trained on)."""
    fraction: float | None = Field(
        None, gt=0.0, lt=1.0, json_schema_extra=shown(default="one of day, fraction, progressive")
    )
    """Hold out this fraction of rows."""
    progressive: bool = False
    """Hold out nothing: evaluate on the training rows, so that the evaluation of a run that
    starts from a model (`retrain --follow`'s) is on rows that model has not seen."""
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
        if (self.day is not None) + (self.fraction is not None) + self.progressive != 1:
            raise Problem(
                "", "give exactly one of day (last or YYYY-MM-DD), fraction or progressive: true"
            )
        return self


# What editors are told the schema and bad_rows keys take (the loader checks the rest).
_SCHEMA_JSON = {"anyOf": [{"type": "string"}, {"type": "object"}]}
_BAD_ROWS_JSON = {"anyOf": [{"enum": ["skip", "fail"]}, BadRowPolicy.model_json_schema()]}

BLOCK_SIZE = 64 << 20  # bytes of plain text a partition reads: tens of MB parse in ~a second


def _block_size(value: Any) -> Any:
    value = parse_size(value, "bytes (67108864), a size ('64MiB') or null")
    if isinstance(value, int) and not isinstance(value, bool) and value < 1 << 12:
        raise Problem("", f"{value} bytes is below 4 KiB; blocks that small cost more to plan")
    return value


# pydantic warns that a field named ``schema`` shadows BaseModel.schema, a deprecated classmethod
# daskhps never calls; the key is the one users write.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", 'Field name "schema"', UserWarning)

    class DataConfig(Options):
        """Where training rows come from (``train`` files or ``generate``), how they are read
        and which rows are held out for evaluation. :attr:`source` is what the reader takes."""

        train: TrainLogs | None = Field(
            None, json_schema_extra=shown(default="one of train, generate")
        )
        """Click logs to train on. Exactly one of `train` or `generate`."""
        generate: GenerateConfig | None = Field(
            None, json_schema_extra=shown(default="one of train, generate")
        )
        """Synthetic Criteo-format logs to generate or reuse."""
        schema: Annotated[Schema, WithJsonSchema(_SCHEMA_JSON)] = Field(  # type: ignore[assignment]
            criteo_schema(), json_schema_extra=shown("name, path or mapping")
        )
        """Schema of the logs: `criteo`, a schema file (beside the config first) or inline."""
        bad_rows: Annotated[BadRowPolicy, WithJsonSchema(_BAD_ROWS_JSON)] = Field(
            BadRowPolicy(), json_schema_extra=shown("`skip`, `fail` or mapping")
        )
        """What to do with malformed rows."""
        holdout: HoldoutConfig | None = Field(None, json_schema_extra=shown("mapping or null"))
        """Rows held out for evaluation; null: none."""
        backend: Backend = "auto"
        """Dataframe backend (auto: cudf on GPU)."""
        block_size: Annotated[
            Int | None, BeforeValidator(_block_size), WithJsonSchema(SIZE_JSON)
        ] = Field(BLOCK_SIZE, json_schema_extra=shown("bytes, a size (`64MiB`) or null"))
        """Read plain-text files larger than this in blocks (one partition each); null: whole."""

        NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = ("schema", "bad_rows")

        @model_validator(mode="after")
        def _one_source(self) -> DataConfig:
            if (self.train is None) == (self.generate is None):
                raise Problem(
                    "",
                    "give exactly one of train (paths of click logs) or generate (synthetic logs)",
                )
            if self.generate is not None and self.schema != criteo_schema():
                raise Problem(
                    "schema", "generated logs are Criteo-format; leave schema out (criteo)"
                )
            holdout = self.holdout
            if self.generate is not None and holdout is not None and holdout.day is not None:
                days = self.generate.generator.day_names()
                if holdout.day != "last" and holdout.day not in days:
                    raise Problem(
                        "holdout.day", f"{holdout.day} is not a generated day ({', '.join(days)})"
                    )
                if len(days) < 2:
                    raise Problem(
                        "holdout.day",
                        "holding out the only generated day leaves nothing to train on; "
                        "set data.generate.days >= 2 or use holdout.fraction",
                    )
            return self

        @classmethod
        def parse(cls, d: Any, ctx: Ctx, run_dir: str, seed: int) -> DataConfig:
            if isinstance(d, Mapping) and d.get("schema") is not None:
                # A schema file is found beside the config, and its errors name data.schema.
                d = {**d, "schema": schema_at(d["schema"], ctx, "data.schema")}
            return validate(cls, d, ctx, "data", {"run_dir": run_dir, "seed": seed})

        @property
        def source(self) -> DataSource:
            """The training files: ``train``, or the complete generated days under ``out``."""
            if self.train is not None:
                return self.train.source(self.schema, self.bad_rows)
            assert self.generate is not None
            return DataSource(
                paths=(self.generate.out,),
                schema=self.schema,
                days=self.generate.day_range,  # never stale days of an earlier, longer generation
                require_complete=True,
                bad_rows=self.bad_rows,
            )

        def to_dict(self) -> dict[str, Any]:
            out = super().to_dict()
            out["schema"] = "criteo" if self.schema == criteo_schema() else self.schema.to_dict()
            return out

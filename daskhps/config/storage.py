"""The ``storage`` section: how daskhps reaches object storage and other fsspec stores
(docs/operations.md, "Logs and copies in object storage")."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from daskhps.options import Ctx, Options, Problem, shown, validate

__all__ = ["StorageConfig"]


class StorageConfig(Options):
    """fsspec storage options per protocol, used on the driver and on every worker for the
    logs, the checkpoint copy and the models a run reads or writes at URLs. Credentials are
    best left to the environment or the packages' own files; whatever is given here is never
    printed and never written into the run folder (its ``config.yaml`` leaves this section
    out)."""

    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        repr=False,  # may hold credentials: never in a log line or a traceback's locals
        json_schema_extra=shown("mapping of protocol to options", "{}"),
    )
    """fsspec options per protocol, e.g. `{s3: {endpoint_url: ...}}`."""

    @field_validator("options", mode="before")
    @classmethod
    def _per_protocol(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise Problem("", "expected a mapping of protocol (s3, gs, ...) to its options")
        for protocol, opts in value.items():
            if not isinstance(protocol, str) or "://" in protocol or not protocol:
                raise Problem("", f"{protocol!r} is not a protocol name: write s3, gs, abfs, ...")
            if not isinstance(opts, dict):
                raise Problem(protocol, "expected a mapping of fsspec options")
        return value

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> StorageConfig:
        return validate(cls, d, ctx, "storage")

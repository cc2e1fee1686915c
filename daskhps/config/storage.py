"""The ``storage`` section: how daskhps reaches object storage and other fsspec stores
(docs/operations.md, "Logs and copies in object storage")."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from daskhps import storage
from daskhps.options import Ctx, Options, Problem, closest, join, shown, validate

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
            _check_names(protocol, opts)
        return value

    @classmethod
    def parse(cls, d: Any, ctx: Ctx) -> StorageConfig:
        return validate(cls, d, ctx, "storage")


def _check_names(protocol: str, opts: dict[Any, Any]) -> None:
    """Each option of ``protocol`` is one its filesystem takes: a misspelt one would else be
    ignored, or refused by the package deep in the first request, as a traceback. A protocol
    whose package is not installed is left to the URL that uses it, which says so."""
    allowed = storage.option_names(protocol)
    if allowed is None:
        return
    unknown = [k for k in opts if k not in allowed]
    if not unknown:
        return
    names = sorted(allowed)
    hint = closest(str(unknown[0]), names)
    did = f"did you mean {join(f'storage.options.{protocol}', hint)!r}? " if hint else ""
    raise Problem(
        f"{protocol}.{unknown[0]}",
        f"unknown option of the {protocol}:// filesystem; {did}allowed options: {', '.join(names)}",
    )

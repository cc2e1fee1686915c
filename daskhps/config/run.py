"""The ``run`` section: name, run directory, seed, verbosity."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from daskhps.options import Ctx, Int, Options, Problem, shown, validate

__all__ = ["RunSection"]


class RunSection(Options):
    """``name`` labels the run and names its directory ``dir`` (default ``runs/<name>``), which
    holds checkpoints, metrics.jsonl, summary.json and logs. ``seed`` is the default of every
    other seed (table initialisation, holdout split, plan)."""

    name: str = Field("daskhps", json_schema_extra=shown(default="the config file's name"))
    """Run name: letters, digits, `-_.`."""
    dir: str = Field("runs/daskhps", json_schema_extra=shown("path", "`runs/<run.name>`"))
    """Run directory: metrics, checkpoints, logs."""
    seed: Int = Field(0, ge=0)
    """Default of every other seed (table, holdout)."""
    quiet: bool = False
    """No progress output on the terminal."""

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any, info: ValidationInfo) -> Any:
        # The name defaults to the config file's; the directory (null too) to runs/<name>.
        if data is None:
            data = {}
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "name" not in data and info.context and "default_name" in info.context:
            data["name"] = info.context["default_name"]
        if data.get("dir") is None and isinstance(data.get("name", "daskhps"), str):
            data["dir"] = f"runs/{data.get('name', 'daskhps')}"
        return data

    @field_validator("name")
    @classmethod
    def _folder_name(cls, name: str) -> str:
        if not name or not all(c.isalnum() or c in "-_." for c in name) or name[0] == ".":
            raise Problem("", f"{name!r}: use letters, digits, '-', '_' or '.' (it names a folder)")
        return name

    @classmethod
    def parse(cls, d: Any, ctx: Ctx, default_name: str = "daskhps") -> RunSection:
        return validate(cls, d, ctx, "run", {"default_name": default_name})

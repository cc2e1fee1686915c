"""The ``model`` section of a run config, validated and frozen."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from daskhps.errors import ConfigError, ConfigKeyError
from daskhps.models.base import InputLayout
from daskhps.models.options import OptionError, check_options
from daskhps.models.registry import BUILTIN_MODELS, build_for, resolve_model, sparse_dim_of

__all__ = ["FrozenOptions", "ModelSpec"]


class FrozenOptions(Mapping[str, Any]):
    """A read-only mapping that, unlike ``MappingProxyType``, pickles (specs travel to workers)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return repr(self._data)


def _freeze(value: Any) -> Any:
    # YAML lists become tuples and mappings read-only, so a spec cannot change after validation.
    if isinstance(value, Mapping):
        return FrozenOptions({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class ModelSpec:
    """Which dense model a run trains, validated and read-only.

    Parameters
    ----------
    name:
        A built-in model name or a ``"package.module:ClassName"`` import path.
    options:
        The model's constructor options; stored as a read-only mapping, lists as tuples.
    origin:
        Where the spec came from (``"run.yaml: model"``), for error messages only.
    """

    name: str
    # Excluded from the hash (a mapping is unhashable); equality still compares it.
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    origin: str = field(default="ModelSpec", compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigKeyError(self.origin, "name", f"must be a string, got {self.name!r}")
        if not isinstance(self.options, Mapping):
            raise ConfigKeyError(self.origin, "options", f"must be a mapping, got {self.options!r}")
        bad_keys = [k for k in self.options if not isinstance(k, str)]
        if bad_keys:
            raise ConfigKeyError(
                self.origin, "options", f"option names must be strings: {bad_keys}"
            )
        object.__setattr__(self, "options", _freeze(self.options))
        try:
            cls = resolve_model(self.name)
        except ConfigError as e:
            raise ConfigKeyError(self.origin, "name", str(e)) from e.__cause__
        try:
            check_options(cls, self.name, self.options)
        except OptionError as e:
            key = "options" + (f".{e.option}" if e.option else "")
            raise ConfigKeyError(self.origin, key, e.message) from None

    @classmethod
    def from_dict(cls, d: Any, source: str = "<config>", key: str = "model") -> ModelSpec:
        """Validate the ``model`` section of a config file.

        Parameters
        ----------
        d:
            ``{"name": str, "options": {...}}``; ``options`` may be left out.
        source:
            The file the section came from, named in every error.
        key:
            Where the section sits in that file.

        Raises
        ------
        ConfigError
            Naming ``source`` and the key: not a mapping, missing ``name``, unknown keys, wrong
            types, an unknown model or option, or a bad option value.
        """
        origin = f"{source}: {key}"
        if not isinstance(d, Mapping):
            raise ConfigKeyError(
                origin, "", f"must be a mapping with 'name' and 'options', got {d!r}"
            )
        unknown = sorted(str(k) for k in d if k not in ("name", "options"))
        if unknown:
            raise ConfigKeyError(
                origin, unknown[0], "unknown key; allowed keys: ['name', 'options']"
            )
        if "name" not in d:
            raise ConfigKeyError(
                origin,
                "name",
                f"missing; use one of {sorted(BUILTIN_MODELS)} or 'package.module:ClassName'",
            )
        options = d.get("options")
        return cls(name=d["name"], options={} if options is None else options, origin=origin)

    def to_dict(self) -> dict[str, Any]:
        """Plain ``{"name", "options"}`` (lists, dicts) that :meth:`from_dict` reads back."""
        return {"name": self.name, "options": _thaw(self.options)}

    def sparse_dim(self, embedding_dim: int) -> int:
        """Floats per key the model reads from the table, see :func:`sparse_dim_of`."""
        return sparse_dim_of(resolve_model(self.name), embedding_dim)

    def build(
        self,
        *,
        num_dense: int,
        num_fields: int,
        embedding_dim: int,
        field_dims: Sequence[int] | None = None,
    ) -> nn.Module:
        """:meth:`build_for` the layout of these arguments (as :func:`build_model` takes them)."""
        return self.build_for(InputLayout(num_dense, num_fields, embedding_dim, field_dims))

    def build_for(self, layout: InputLayout) -> nn.Module:
        """:func:`build_for` with this spec; errors are prefixed with the spec's origin."""
        try:
            return build_for(self.name, layout, _thaw(self.options))
        except ConfigError as e:
            raise ConfigError(f"{self.origin}: {e}") from e

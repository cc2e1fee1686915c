"""Names a package loads from its submodules on first use.

The packages that daskhps.config composes (data, passes) re-export names whose modules build
Dask graphs; loading those on first use keeps ``import daskhps.config`` free of dask.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import Any


def lazy_attribute(package: str, homes: Mapping[str, str], name: str) -> Any:
    """``name`` from ``package``'s submodule ``homes[name]``: a package's ``__getattr__``."""
    if name in homes:
        return getattr(import_module(f"{package}.{homes[name]}"), name)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")

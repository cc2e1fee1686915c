"""daskhps: a hierarchical parameter server on Dask for CTR models with huge embedding tables."""

from __future__ import annotations

from daskhps.errors import DaskHPSError

__version__ = "0.1.0"

__all__ = ["DaskHPSError", "__version__"]

"""Choose the dataframe backend: cuDF only where cudf imports and a GPU is present.

Asking Dask for the cudf backend without cudf raises, and cudf imports on some machines without
a GPU and then fails at run time, so both conditions are checked before choosing it.
"""

from __future__ import annotations

import functools
import logging
from typing import Literal, get_args

from daskhps.errors import ConfigError

__all__ = ["BACKENDS", "Backend", "choose_backend", "cudf_available"]

log = logging.getLogger(__name__)
Backend = Literal["auto", "pandas", "cudf"]
BACKENDS: tuple[str, ...] = get_args(Backend)


@functools.cache
def cudf_available() -> bool:
    """True when cudf imports and at least one CUDA device is visible."""
    try:
        import cudf  # noqa: F401
        import cupy
    except Exception:  # any import failure (missing, broken CUDA libs) means "no"
        return False
    try:
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


def choose_backend(requested: str = "auto") -> str:
    """``pandas`` or ``cudf``; ``auto`` picks cudf where it can run."""
    if requested not in BACKENDS:
        raise ConfigError(f"backend {requested!r}: choose one of {', '.join(BACKENDS)}")
    if requested == "auto":
        backend = "cudf" if cudf_available() else "pandas"
    elif requested == "cudf" and not cudf_available():
        raise ConfigError(
            "backend 'cudf': cudf is not installed or no GPU is visible; "
            "install the gpu extra on a GPU machine or use backend 'pandas'"
        )
    else:
        backend = requested
    log.debug("dataframe backend: %s", backend)
    return backend

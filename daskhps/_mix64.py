"""splitmix64's finaliser, declared once for every array library daskhps hashes with.

::

    fmix64(x): x ^= x >> 30; x *= M1; x ^= x >> 27; x *= M2; x ^= x >> 31

on unsigned 64-bit integers, wrapping, ``>>`` a logical shift. Four callers use it, each with
its own variant, and golden vectors pin every one of them:

* ``data.hashing``: numpy uint64 in and out (feature hashes, field salts);
* ``sharding``: int64 keys XOR a salt, the result masked to 63 bits (numpy, cupy or torch);
* ``table.init``: torch int64, unmasked (counter-based initial values);
* ``tiers.index``: torch int64 XOR a seed, without the last xor-shift (only the top bits are
  used and that step changes low bits only), in place in caller-owned buffers.

The variants are the parameters below (``final``, the in-place torch form), not copies of
the arithmetic. This module imports neither dask nor distributed, and imports torch only when
a torch function runs, so the numpy-only data pipeline does not pay for it; cupy arrays go
through the numpy function with ``xp=cupy``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "M1",
    "M2",
    "MASK63",
    "SHIFTS",
    "fmix64_numpy",
    "fmix64_torch",
    "fmix64_torch_",
    "s64",
]

M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB
SHIFTS = (30, 27, 31)
MASK63 = (1 << 63) - 1

_U64 = 1 << 64


def s64(x: int) -> int:
    """An unsigned 64-bit value as the int64 with the same bits (what torch stores)."""
    x %= _U64
    return x - _U64 if x >= 1 << 63 else x


_M1_S = s64(M1)
_M2_S = s64(M2)
_S1, _S2, _S3 = SHIFTS


def fmix64_numpy(x: Any, xp: Any = np, *, final: bool = True) -> Any:
    """The finaliser on a uint64 array of ``xp`` (numpy or cupy); a new uint64 array back.

    ``final=False`` skips the last xor-shift. In-place steps on one fresh array keep the
    temporaries to two (this runs on every feature hash and every routed key).
    """
    u64 = xp.uint64
    with np.errstate(over="ignore"):
        z = x >> u64(_S1)
        z ^= x
        z *= u64(M1)
        z ^= z >> u64(_S2)
        z *= u64(M2)
        if final:
            z ^= z >> u64(_S3)
    return z


def fmix64_torch_(
    z: torch.Tensor, *, final: bool = True, tmp: torch.Tensor | None = None
) -> torch.Tensor:
    """The finaliser in place on an int64 tensor ``z`` (returned); ``tmp`` is an optional
    scratch buffer shaped like ``z``.

    int64 multiplication wraps like uint64 in two's complement; torch's ``>>`` on int64 is
    arithmetic, so each shift is masked to make it logical.
    """
    import torch

    t = torch.bitwise_right_shift(z, _S1, out=tmp) if tmp is not None else z >> _S1
    z.bitwise_xor_(t.bitwise_and_((1 << (64 - _S1)) - 1)).mul_(_M1_S)
    t = torch.bitwise_right_shift(z, _S2, out=t).bitwise_and_((1 << (64 - _S2)) - 1)
    z.bitwise_xor_(t).mul_(_M2_S)
    if final:
        t = torch.bitwise_right_shift(z, _S3, out=t).bitwise_and_((1 << (64 - _S3)) - 1)
        z.bitwise_xor_(t)
    return z


def fmix64_torch(x: torch.Tensor, *, final: bool = True) -> torch.Tensor:
    """The finaliser on an int64 tensor; a new int64 tensor back (``x`` is left alone)."""
    import torch

    return fmix64_torch_(x.to(torch.int64, copy=True), final=final)

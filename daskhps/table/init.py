"""Deterministic row initialisation: a pure function of (table seed, key, column).

A row's starting value never depends on arrival order, shard, worker count or tier sizes, so
re-sharding, resuming and resizing tiers never change it (docs/invariants.md, invariant 2).
Values come from a counter-based hash (splitmix64) evaluated in torch int64 arithmetic, which
wraps on overflow identically on CPU and CUDA; only the final scaling is floating point, one
IEEE multiply, so every device gives the same bits. Golden vectors in the tests pin the function.
"""

from __future__ import annotations

from typing import Any

import torch

from daskhps._mix64 import M1, M2, fmix64_torch, fmix64_torch_, s64

__all__ = ["init_embedding", "init_spec", "mix64"]

_U64 = 1 << 64
_GAMMA = s64(0x9E3779B97F4A7C15)


def _lsr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser: a bijection on 64-bit integers with full avalanche."""
    return fmix64_torch(x)


def init_spec(seed: int, dim: int, scale: float) -> dict[str, Any]:
    """:func:`init_embedding` written out for an implementation outside daskhps."""
    return {
        "seed": seed,
        "dim": dim,
        "scale": scale,
        "definition": [
            "arithmetic on unsigned 64-bit integers, wrapping; >> is a logical shift",
            "mix64(x): x ^= x >> 30; x *= C1; x ^= x >> 27; x *= C2; x ^= x >> 31",
            "base = mix64(key XOR mix64(seed mod 2**64))",
            "for j in 1 .. ceil(dim / 2): h_j = mix64(base + j * GAMMA)",
            "u = [h_1 >> 40, (h_1 >> 16) AND 0xFFFFFF, h_2 >> 40, ...][:dim]  (24-bit integers)",
            "row = (float32(u) * 2**-23 - 1) * float32(scale)  (float32 arithmetic)",
        ],
        "constants": {
            "C1": f"0x{M1:016x}",
            "C2": f"0x{M2:016x}",
            "GAMMA": f"0x{_GAMMA % _U64:016x}",
        },
    }


def init_embedding(keys: torch.Tensor, *, seed: int, dim: int, scale: float) -> torch.Tensor:
    """Uniform(-scale, scale) embeddings for ``keys``: ``float32[n, dim]`` on ``keys.device``.

    Each 64-bit hash yields two 24-bit uniforms (bits 63..40 and 39..16), which halves the
    integer work for the common case of many new keys.
    """
    n = keys.shape[0]
    half = (dim + 1) // 2
    # The operands below are fresh tensors, so the finaliser runs on them in place.
    base = fmix64_torch_(keys ^ mix64(torch.tensor(s64(seed), dtype=torch.int64)))
    cols = torch.arange(1, half + 1, dtype=torch.int64, device=keys.device) * _GAMMA
    h = fmix64_torch_(base[:, None] + cols[None, :])  # [n, half]
    hi = _lsr(h, 40)
    lo = (h >> 16) & 0xFFFFFF
    u = torch.stack([hi, lo], dim=2).reshape(n, 2 * half)[:, :dim]
    out = u.to(torch.float32) * (2.0 / (1 << 24)) - 1.0  # exact: 24-bit integers, power-of-2 scale
    return out * scale

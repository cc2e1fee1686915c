"""A serving stack outside daskhps, written from ``export.json`` alone: raw log rows to the
model's inputs with plain Python and numpy (no daskhps import), for the export tests.

Everything here follows the definitions and constants the export records, so a test that
matches daskhps's own keys, dense values and predictions shows the export is complete.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

U64 = (1 << 64) - 1


def _c(value: str) -> int:
    return int(value, 16)


class Hps64:
    """``key_hash`` of export.json: hps64 on Python integers, masked to 64 bits."""

    def __init__(self, spec: dict[str, Any]) -> None:
        assert spec["algorithm"] == "hps64"
        c = {k: _c(v) for k, v in spec["constants"].items()}
        self.p1, self.p2, self.m1, self.m2 = c["P1"], c["P2"], c["M1"], c["M2"]
        self.salt_seed, self.missing_tag, self.key_mask = (
            c["SALT_SEED"],
            c["MISSING_TAG"],
            c["KEY_MASK"],
        )

    def fmix(self, x: int) -> int:
        x ^= x >> 30
        x = (x * self.m1) & U64
        x ^= x >> 27
        x = (x * self.m2) & U64
        return x ^ (x >> 31)

    def hash(self, data: bytes, seed: int) -> int:
        h = seed ^ ((len(data) * self.p1) & U64)
        for i in range(0, len(data), 8):
            w = int.from_bytes(data[i : i + 8].ljust(8, b"\0"), "little")
            h ^= (w * self.p2) & U64
            h = ((h << 31) | (h >> 33)) & U64
            h = (h * self.p1) & U64
        return self.fmix(h)

    def salt(self, field: str) -> int:
        return self.hash(field.encode("utf-8"), self.salt_seed)

    def key(self, field: str, value: str | None) -> int:
        salt = self.salt(field)
        if value is None:
            return self.fmix(salt ^ self.missing_tag) & self.key_mask
        return self.hash(value.encode("utf-8"), salt) & self.key_mask


def dense_value(cell: str | None, f: dict[str, Any]) -> np.float32:
    """One dense cell through ``features.dense_rule``."""
    if cell is None:
        return np.float32(f["fill"])
    x = float(cell)
    if f["clip_min"] is not None:
        x = max(x, f["clip_min"])
    if f["clip_max"] is not None:
        x = min(x, f["clip_max"])
    if f["transform"] == "log1p":
        x = math.log1p(x)
    return np.float32(x)


def initial_rows(keys: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    """``unseen_keys`` of export.json: the initial rows of keys the dump lacks."""
    c = {k: _c(v) for k, v in spec["constants"].items()}

    def mix(x: int) -> int:
        x ^= x >> 30
        x = (x * c["C1"]) & U64
        x ^= x >> 27
        x = (x * c["C2"]) & U64
        return x ^ (x >> 31)

    dim = spec["dim"]
    out = np.empty((len(keys), dim), dtype=np.float32)
    seed_mix = mix(spec["seed"] & U64)
    for i, key in enumerate(int(k) & U64 for k in keys):
        base = mix(key ^ seed_mix)
        u = []
        for j in range(1, (dim + 1) // 2 + 1):
            h = mix((base + j * c["GAMMA"]) & U64)
            u += [h >> 40, (h >> 16) & 0xFFFFFF]
        row = np.array(u[:dim], dtype=np.float32) * np.float32(2.0**-23) - np.float32(1.0)
        out[i] = row * np.float32(spec["scale"])
    return out


class Inputs:
    """Raw rows of a log file to the model's ``dense`` input and to keys."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta
        self.features = meta["features"]
        self.hash = Hps64(meta["key_hash"])

    def cells(self, lines: list[str]) -> list[dict[str, str | None]]:
        schema = self.features["schema"]
        assert schema["format"] == "tsv" and not schema.get("header")
        sep = schema.get("delimiter") or "\t"
        return [
            {
                c: (v if v != "" else None)
                for c, v in zip(schema["columns"], line.split(sep), strict=True)
            }
            for line in lines
        ]

    def keys(self, rows: list[dict[str, str | None]]) -> np.ndarray:
        fields = self.features["categorical"]
        assert not any(f["separator"] for f in fields)  # single-hot logs in these tests
        names = self.meta["inputs"]["sparse"]["fields"]
        assert names == [f["name"] for f in fields]
        return np.array(
            [[self.hash.key(f, r[f]) for f in names] for r in rows], dtype=np.uint64
        ).view(np.int64)

    def dense(self, rows: list[dict[str, str | None]]) -> np.ndarray:
        fields = self.features["dense"]
        assert self.meta["inputs"]["dense"]["columns"] == [f["name"] for f in fields]
        return np.array(
            [[dense_value(r[f["name"]], f) for f in fields] for r in rows], dtype=np.float32
        )


def sparse_input(folder: Path, meta: dict[str, Any], keys: np.ndarray) -> np.ndarray:
    """The rows of ``keys`` (``[B, F]``): from the dump, else their initial rows."""
    dump_keys = np.load(folder / meta["files"]["keys"])
    dump_rows = np.load(folder / meta["files"]["embeddings"])
    order = np.argsort(dump_keys)
    sorted_keys = dump_keys[order]
    flat = keys.reshape(-1)
    pos = np.minimum(np.searchsorted(sorted_keys, flat), len(sorted_keys) - 1)
    hit = sorted_keys[pos] == flat
    rows = np.empty((len(flat), dump_rows.shape[1]), dtype=np.float32)
    rows[hit] = dump_rows[order][pos[hit]]
    rows[~hit] = initial_rows(flat[~hit], meta["unseen_keys"])
    return rows.reshape(*keys.shape, -1)

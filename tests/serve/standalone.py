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
        # several tables: a key's table index in its bits from TABLE_SHIFT up
        self.table_shift, self.low_mask = c.get("TABLE_SHIFT"), c.get("LOW_MASK")

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

    def key(self, field: str, value: str | None, table: int | None = None) -> int:
        """The key of ``value`` salted with the name ``field``, tagged with ``table``."""
        salt = self.salt(field)
        if value is None:
            key = self.fmix(salt ^ self.missing_tag) & self.key_mask
        else:
            key = self.hash(value.encode("utf-8"), salt) & self.key_mask
        if table is None:
            return key
        assert self.table_shift is not None and self.low_mask is not None
        return (key & self.low_mask) | (table << self.table_shift)


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
        # salted with salt_name (a shared table's name) and tagged with table, where given
        rules = [(f["name"], f.get("salt_name", f["name"]), f.get("table")) for f in fields]
        return np.array(
            [[self.hash.key(salt, r[f], table) for f, salt, table in rules] for r in rows],
            dtype=np.uint64,
        ).view(np.int64)

    def dense(self, rows: list[dict[str, str | None]]) -> np.ndarray:
        fields = self.features["dense"]
        assert self.meta["inputs"]["dense"]["columns"] == [f["name"] for f in fields]
        return np.array(
            [[dense_value(r[f["name"]], f) for f in fields] for r in rows], dtype=np.float32
        )


def sparse_input(folder: Path, meta: dict[str, Any], keys: np.ndarray) -> np.ndarray:
    """The rows of ``keys`` (``[B, F]``): from the dump, else their initial rows; with several
    tables, each field's from its table's dump, laid out as ``inputs.sparse`` says."""
    if "tables" not in meta:
        return _rows(folder, meta["files"], meta["unseen_keys"], keys)
    fields = meta["inputs"]["sparse"]["fields"]
    tables = meta["tables"]
    parts = []
    for f, name in enumerate(fields):
        t = tables[meta["feature_tables"][name]["index"]]
        parts.append(_rows(folder, t["files"], t["unseen_keys"], keys[:, f]))
    if len(meta["inputs"]["sparse"]["shape"]) == 2:  # flat: [B, sum of the fields' widths]
        columns = meta["inputs"]["sparse"]["columns"]
        widths = [p.shape[1] for p in parts]
        ends = np.cumsum(widths).tolist()
        assert [columns[f] for f in fields] == [
            [e - w, e] for w, e in zip(widths, ends, strict=True)
        ]
        return np.concatenate(parts, axis=1)
    return np.stack(parts, axis=1)


def _rows(
    folder: Path, files: dict[str, str], init: dict[str, Any], keys: np.ndarray
) -> np.ndarray:
    dump_keys = np.load(folder / files["keys"])
    dump_rows = np.load(folder / files["embeddings"])
    order = np.argsort(dump_keys)
    sorted_keys = dump_keys[order]
    flat = keys.reshape(-1)
    pos = np.minimum(np.searchsorted(sorted_keys, flat), len(sorted_keys) - 1)
    hit = sorted_keys[pos] == flat
    rows = np.empty((len(flat), dump_rows.shape[1]), dtype=np.float32)
    rows[hit] = dump_rows[order][pos[hit]]
    rows[~hit] = initial_rows(flat[~hit], init)
    return rows.reshape(*keys.shape, -1)

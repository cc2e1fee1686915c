"""Feature hashing: ``(field, value) -> int64 key``, one function of the project's own.

Keys must never change between releases or backends (daily retraining finds yesterday's rows
by key), so the function is written down here and pinned by golden test vectors.

Definition (``hps64``; all arithmetic modulo 2**64)::

    bytes  = UTF-8 of the value, cut into 8-byte little-endian words, the last zero-padded
    h      = seed XOR (len(bytes) * P1)
    for w in words:  h = rotl(h XOR (w * P2), 31) * P1
    hps64(bytes, seed) = fmix(h)           # the splitmix64 finaliser

    salt(field)       = hps64(UTF-8 of the field name, SALT_SEED)
    key(field, value) = hps64(value, salt(field))                 & (2**63 - 1)
    key(field, None)  = fmix(salt(field) XOR MISSING_TAG)         & (2**63 - 1)

Keys are non-negative int64 values, so tiers may use negative numbers as sentinels. An 8-digit
Criteo value is a single word: the common case costs one multiply-rotate and the finaliser.

The implementation works on Arrow string buffers (offsets + bytes) with one numpy pass per word
position, so there is no per-row Python loop.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from daskhps._mix64 import M1, M2, fmix64_numpy

__all__ = [
    "KEY_MASK",
    "MISSING_TAG",
    "SALT_SEED",
    "field_salt",
    "fmix64",
    "hash_bytes",
    "hash_column",
    "hash_rows",
    "hash_spec",
    "hash_values",
    "missing_key",
]

P1 = np.uint64(0x9E3779B185EBCA87)
P2 = np.uint64(0xC2B2AE3D27D4EB4F)
SALT_SEED = 0x6461736B68707331  # "daskhps1"
MISSING_TAG = 0x4D495353494E4721  # "MISSING!"
KEY_MASK = (1 << 63) - 1

_MASK_U = np.uint64(KEY_MASK)


def fmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on a uint64 array (a bijection with full avalanche)."""
    return fmix64_numpy(x)


def _rotl31(x: np.ndarray) -> np.ndarray:
    return (x << np.uint64(31)) | (x >> np.uint64(33))


_BYTE_MASKS = np.array([(1 << (8 * t)) - 1 for t in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


# Rows per block: temporaries stay in cache and are reused by the allocator instead of being
# page-faulted in fresh for every column (which costs more than the arithmetic).
_BLOCK = 1 << 15


def _hash_buffers(
    data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, seed: int | np.ndarray
) -> np.ndarray:
    """hps64 of ``data[starts[i] : starts[i] + lengths[i]]`` for every i, as uint64; ``seed``
    one for all, or ``uint64[n]``, one for each."""
    n = len(starts)
    out = np.empty(n, dtype=np.uint64)
    if n == 0:
        return out
    # Unaligned 8-byte reads as two aligned uint64 reads and shifts; padding keeps the
    # second read inside the buffer.
    nbuf = (len(data) + 7) // 8 + 2
    padded = np.zeros(nbuf * 8, dtype=np.uint8)
    padded[: len(data)] = data
    words = padded.view("<u8")
    for lo in range(0, n, _BLOCK):
        hi = min(lo + _BLOCK, n)
        s = seed if isinstance(seed, int) else seed[lo:hi]
        out[lo:hi] = _hash_block(words, starts[lo:hi], lengths[lo:hi], s)
    return out


def _hash_block(
    words: np.ndarray, starts: np.ndarray, lengths: np.ndarray, seed: int | np.ndarray
) -> np.ndarray:
    n = len(starts)
    with np.errstate(over="ignore"):
        h = (np.uint64(seed) if isinstance(seed, int) else seed) ^ (lengths.astype(np.uint64) * P1)
        nwords = (int(lengths.max()) + 7) // 8
        for k in range(nwords):
            live = lengths > 8 * k
            nlive = int(np.count_nonzero(live))
            # Few live rows (the tail of long strings): work on them alone; otherwise compute
            # every row and keep the live ones (cheaper than gathering and scattering).
            rows = np.flatnonzero(live) if nlive < n // 4 else None
            pos = starts + 8 * k if rows is None else starts[rows] + 8 * k
            ln = lengths if rows is None else lengths[rows]
            a = np.minimum(pos >> 3, len(words) - 2)  # rows past their end read harmless words
            irregular = ((pos & 7) != 0) | (ln < 8 * (k + 1))
            if rows is None:
                irregular &= live
            if not np.any(irregular):
                # Aligned whole words (e.g. Criteo's 8 hex digits, nulls having length 0).
                w = words[a]
            else:
                r = (pos & 7).astype(np.uint64) * np.uint64(8)
                lo = words[a] >> r
                hi = (words[a + 1] << ((np.uint64(64) - r) & np.uint64(63))) * (r > 0)
                w = (lo | hi) & _BYTE_MASKS[np.clip(ln - 8 * k, 0, 8)]
            if rows is None:
                step = _rotl31(h ^ (w * P2)) * P1
                h = step if nlive == n else np.where(live, step, h)
            else:
                h[rows] = _rotl31(h[rows] ^ (w * P2)) * P1
        return fmix64(h)


def hash_bytes(values: list[bytes], seed: int) -> np.ndarray:
    """hps64 of each byte string (a reference path for tests and small inputs)."""
    lengths = np.array([len(v) for v in values], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    data = np.frombuffer(b"".join(values), dtype=np.uint8)
    return _hash_buffers(data, starts, lengths, seed)


@functools.lru_cache(maxsize=4096)
def field_salt(field: str) -> int:
    """The per-field seed: hps64 of the field name (kept: a salt costs a vectorised hash of
    its own, more than hashing a column of a few values)."""
    return int(hash_bytes([field.encode("utf-8")], SALT_SEED)[0])


def missing_key(field: str) -> int:
    """The key of a missing value of ``field``."""
    with np.errstate(over="ignore"):
        salt = np.array([field_salt(field)], dtype=np.uint64)
        return int((fmix64(salt ^ np.uint64(MISSING_TAG)) & _MASK_U)[0])


def _hex(x: int | np.uint64) -> str:
    return f"0x{int(x):016x}"


def hash_spec() -> dict[str, Any]:
    """The key function written out for an implementation outside daskhps (``export.json``):
    the definition above, step by step, and its constants as 16-digit hex strings (64-bit
    values do not survive JSON readers that hold numbers as doubles)."""
    return {
        "algorithm": "hps64",
        "definition": [
            "arithmetic on unsigned 64-bit integers, wrapping (mod 2**64); >> is a logical shift",
            "bytes: the UTF-8 of the value as the log holds it (an integer: its decimal text)",
            "words: bytes cut into 8-byte little-endian words, the last one zero-padded",
            "h = seed XOR (len(bytes) * P1); for each word w in order: "
            "h = rotl(h XOR (w * P2), 31) * P1",
            "hps64(bytes, seed) = fmix64(h)",
            "fmix64(x): x ^= x >> 30; x *= M1; x ^= x >> 27; x *= M2; x ^= x >> 31",
            "salt(field) = hps64(UTF-8 of the field's name, SALT_SEED): the field enters a key "
            "through its name (not its position), as the seed of the value's hash",
            "key(field, value) = hps64(value, salt(field)) AND KEY_MASK",
            "key(field, missing) = fmix64(salt(field) XOR MISSING_TAG) AND KEY_MASK "
            "(an empty cell is missing)",
        ],
        "constants": {
            "P1": _hex(P1),
            "P2": _hex(P2),
            "M1": _hex(M1),
            "M2": _hex(M2),
            "SALT_SEED": _hex(SALT_SEED),
            "MISSING_TAG": _hex(MISSING_TAG),
            "KEY_MASK": _hex(KEY_MASK),
        },
    }


def _as_string_array(values: Any) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    elif not isinstance(values, pa.Array):
        values = pa.array(values, from_pandas=True)
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if pa.types.is_integer(values.type):
        values = pc.cast(values, pa.string())  # integers hash by their decimal text
    if not (pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type)):
        values = pc.cast(values, pa.large_string())
    return values


def hash_column(values: Any, field: str) -> np.ndarray:
    """Keys of one categorical field: an Arrow/pandas/numpy array of strings -> int64 keys.

    Nulls (and NaN in object arrays) get :func:`missing_key` of the field. Integer arrays are
    hashed by their decimal text, so a column read from parquet as int64 gets the same keys as
    the same column read from text.
    """
    if type(values).__module__.split(".")[0] in ("cudf", "dask_cudf"):
        # Same function on GPU data: today through host Arrow buffers (exact, not fast).
        values = values.to_arrow()
    arr = _as_string_array(values)
    keys = _hash_buffers(*_string_buffers(arr), field_salt(field)) & _MASK_U
    out = keys.view(np.int64)
    if arr.null_count:
        out[np.asarray(arr.is_null())] = missing_key(field)
    return out


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(data, starts, lengths)`` of a large-string array's values, without copies."""
    n = len(arr)
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, dtype=np.uint8)
    )
    starts = offsets[:-1]
    return data, starts, offsets[1:] - starts


def hash_values(values: Any, field: str) -> pd.Series | np.ndarray:
    """Like :func:`hash_column`, keeping a pandas Series' index when given one."""
    if isinstance(values, pd.Series):
        return pd.Series(hash_column(values, field), index=values.index, name=values.name)
    return hash_column(values, field)


@functools.lru_cache(maxsize=64)
def _row_seeds(fields: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The salts (``uint64``) and missing keys (``int64``) of ``fields``, in order."""
    salts = np.array([field_salt(f) for f in fields], dtype=np.uint64)
    missing = np.array([missing_key(f) for f in fields], dtype=np.int64)
    salts.flags.writeable = missing.flags.writeable = False
    return salts, missing


def hash_rows(cells: Any, fields: Sequence[str]) -> np.ndarray:
    """Keys of rows of categorical cells, every field in one pass: ``int64[n, len(fields)]``.

    ``cells`` (a list or an Arrow array) holds ``n`` rows one after the other: cell ``i * F +
    j`` is field ``fields[j]`` of row ``i``; a cell is a string, or None for a missing value (an
    integer value: its decimal text). Each key is the one :func:`hash_column` gives that field's
    value. One vectorised pass whatever the number of fields, where :func:`hash_column` makes
    one a field: what a request of a few rows costs.
    """
    nf = len(fields)
    arr = _as_string_array(cells if isinstance(cells, (pa.Array, pa.ChunkedArray)) else
                           pa.array(cells, pa.large_string()))  # fmt: skip
    n = len(arr)
    if nf == 0 or n % nf:
        raise ValueError(f"hash_rows: {n} cells are not whole rows of {nf} fields")
    rows = n // nf
    salts, missing = _row_seeds(tuple(fields))
    keys = _hash_buffers(*_string_buffers(arr), np.tile(salts, rows)) & _MASK_U
    out = keys.view(np.int64).reshape(rows, nf)
    if arr.null_count:
        null = np.asarray(arr.is_null()).reshape(rows, nf)
        out[null] = np.broadcast_to(missing, (rows, nf))[null]
    return out

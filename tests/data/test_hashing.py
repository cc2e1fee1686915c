"""The feature hash: golden vectors (never change them), a scalar reference model, backends."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.data.hashing import (
    KEY_MASK,
    field_salt,
    hash_column,
    hash_rows,
    hash_values,
    missing_key,
)

# Computed once from the definition in daskhps/data/hashing.py. Checkpoints depend on these:
# a change here means every stored embedding row becomes unreachable.
GOLDEN = [
    ("C1", "68fd1e64", 7577068805331155706),
    ("C1", "00000000", 1160363720260565063),
    ("C2", "68fd1e64", 6085316228801217973),
    ("C26", "", 3078690703587209639),
    ("site_id", "1fbe01fe", 435135596350060803),
    ("app_id", "ecad2386", 1783526707361480036),
    ("tags", "ü-日本", 2605792648947367764),
    ("C1", "aaaaaaaaaaaaaaaaa", 857614299480746396),
    ("hour", "14102100", 6119963976025340250),
]
GOLDEN_MISSING = {
    "C1": 6149346415753162963,
    "C2": 8217194717805771213,
    "site_id": 2783550564745463757,
}
GOLDEN_SALT = {"C1": 9680275548129475141, "C2": 3518529893416514012}

M64 = (1 << 64) - 1


def _fmix(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def _hps64(data: bytes, seed: int) -> int:
    """Scalar reference of the documented definition, in plain Python integers."""
    h = seed ^ ((len(data) * 0x9E3779B185EBCA87) & M64)
    for i in range(0, len(data), 8):
        w = int.from_bytes(data[i : i + 8].ljust(8, b"\0"), "little")
        h ^= (w * 0xC2B2AE3D27D4EB4F) & M64
        h = ((h << 31) | (h >> 33)) & M64
        h = (h * 0x9E3779B185EBCA87) & M64
    return _fmix(h)


def _ref_key(field: str, value: str | None) -> int:
    salt = _hps64(field.encode(), 0x6461736B68707331)
    if value is None:
        return _fmix(salt ^ 0x4D495353494E4721) & KEY_MASK
    return _hps64(value.encode(), salt) & KEY_MASK


@pytest.mark.parametrize(("field", "value", "key"), GOLDEN)
def test_golden_vectors(field: str, value: str, key: int) -> None:
    assert int(hash_column([value], field)[0]) == key
    assert _ref_key(field, value) == key


def test_golden_missing_and_salts() -> None:
    for field, key in GOLDEN_MISSING.items():
        assert missing_key(field) == key
        assert int(hash_column(pa.array([None], pa.string()), field)[0]) == key
    for field, salt in GOLDEN_SALT.items():
        assert field_salt(field) == salt


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=30),
    st.sampled_from(["C1", "site_id", "x"]),
)
def test_matches_scalar_reference(values: list[str | None], field: str) -> None:
    got = hash_column(pa.array(values, pa.string()), field)
    assert got.dtype == np.int64
    assert got.tolist() == [_ref_key(field, v) for v in values]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=20)), max_size=24), st.integers(1, 4))
def test_rows_of_cells_key_as_their_columns(cells: list[str | None], nf: int) -> None:
    fields = ["C1", "site_id", "x", "C2"][:nf]
    cells = cells[: len(cells) // nf * nf]  # whole rows
    got = hash_rows(cells, fields)
    assert got.shape == (len(cells) // nf, nf) and got.dtype == np.int64
    for j, f in enumerate(fields):
        want = hash_column(pa.array(cells[j::nf], pa.string()), f)
        assert got[:, j].tolist() == want.tolist()


def test_rows_of_cells_past_a_block_and_not_whole_rows() -> None:
    cells = [None if i % 7 == 0 else f"{i:x}" * (i % 5) for i in range(3 * 20000)]
    got = hash_rows(cells, ["a", "b", "c"])  # over the hashing block of 2**15 cells
    for j, f in enumerate(["a", "b", "c"]):
        assert np.array_equal(got[:, j], hash_column(pa.array(cells[j::3], pa.string()), f))
    with pytest.raises(ValueError, match="not whole rows"):
        hash_rows(["a", "b"], ["a", "b", "c"])


def test_keys_are_non_negative_and_field_salted() -> None:
    vals = [f"{i:08x}" for i in range(5000)]
    a, b = hash_column(vals, "C1"), hash_column(vals, "C2")
    assert (a >= 0).all() and (b >= 0).all()
    assert len(np.intersect1d(a, b)) == 0
    assert len(np.unique(a)) == len(vals)
    assert missing_key("C1") != missing_key("C2")


def test_input_kinds_agree() -> None:
    vals = ["68fd1e64", None, "abc", "", "1234"]
    want = hash_column(pa.array(vals), "C1")
    s = pd.Series(vals, dtype="string", index=[5, 6, 7, 8, 9])
    out = hash_values(s, "C1")
    assert isinstance(out, pd.Series) and list(out.index) == [5, 6, 7, 8, 9]
    assert out.tolist() == want.tolist()
    assert hash_column(pd.Series(vals, dtype=object), "C1").tolist() == want.tolist()
    assert hash_column(pa.chunked_array([vals[:2], vals[2:]]), "C1").tolist() == want.tolist()
    # An integer column hashes by its decimal text, as if read from a text file.
    assert (
        hash_column(np.array([1234, 7]), "C1").tolist() == hash_column(["1234", "7"], "C1").tolist()
    )
    # Sliced arrays (non-zero offset) read the right bytes.
    arr = pa.array(["zz", "68fd1e64", "abc"]).slice(1)
    assert hash_column(arr, "C1").tolist() == [want[0], want[2]]


@pytest.mark.gpu
def test_cudf_matches_pandas() -> None:
    cudf = pytest.importorskip("cudf")
    vals = [f"{i:08x}" for i in range(1000)] + [None, "", "ü"]
    cpu = hash_column(pd.Series(vals, dtype="string"), "C7")
    gpu = hash_column(cudf.Series(vals), "C7")
    assert np.asarray(gpu).tolist() == cpu.tolist()

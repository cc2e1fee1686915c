"""Keys that carry their table (daskhps.data.keyspace), against the hash they are made from."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.data.hashing import KEY_MASK, hash_column, missing_key
from daskhps.data.keyspace import LOW_MASK, MAX_TABLES, TABLE_SHIFT, FieldKeys, table_of
from daskhps.data.parse import parse_text
from daskhps.data.schema import Schema

values = st.lists(st.text(min_size=0, max_size=12), min_size=1, max_size=30)


@settings(max_examples=50, deadline=None)
@given(values, st.integers(0, MAX_TABLES), st.sampled_from(["C1", "C2", "shared"]))
def test_a_tagged_key_is_the_hash_low_bits_under_its_table(vals, table, salt):
    keying = FieldKeys(("C1", salt), (0, table))
    got = keying.hash(pa.array(vals), 1)
    want = hash_column(pa.array(vals), salt)
    assert (got >= 0).all()
    assert (table_of(got) == table).all()
    assert ((got & LOW_MASK) == (want & LOW_MASK)).all()
    assert keying.missing(1) == (missing_key(salt) & LOW_MASK) | (table << TABLE_SHIFT)


@settings(max_examples=30, deadline=None)
@given(values)
def test_one_table_keeps_every_bit_of_the_hash(vals):
    keying = FieldKeys(("C1",))
    got = keying.hash(pa.array(vals), 0)
    assert (got == hash_column(pa.array(vals), "C1")).all()
    assert int(got.max()) <= KEY_MASK and keying.missing(0) == missing_key("C1")


def test_fields_of_a_shared_table_share_keys_and_others_do_not():
    vals = pa.array(["a", "b", "a"])
    shared = FieldKeys(("ids", "ids", "C3"), (0, 0, 1))
    assert (shared.hash(vals, 0) == shared.hash(vals, 1)).all()
    own = FieldKeys(("C1", "C2", "C3"), (0, 0, 1))
    assert not np.intersect1d(own.hash(vals, 0), own.hash(vals, 1)).size


def test_field_keys_refuse_what_no_key_can_hold():
    with pytest.raises(ValueError, match=r"table indices must be in 0\.\.127"):
        FieldKeys(("C1",), (128,))
    with pytest.raises(ValueError, match="2 table indices for 1 fields"):
        FieldKeys(("C1",), (0, 1))


def test_a_keyed_schema_parses_to_keys_of_its_tables_and_pickles():
    import pickle

    schema = Schema.from_dict(
        {
            "name": "t",
            "format": "csv",
            "header": True,
            "label": "y",
            "categorical": ["a", {"name": "b", "separator": "|"}],
        }
    )
    keyed = schema.keyed(FieldKeys(("a", "b"), (3, 5)))
    assert keyed == schema  # how a log is read is unchanged
    keyed = pickle.loads(pickle.dumps(keyed))  # as the workers get it
    text = b"y,a,b\n1,x,p|q\n0,,\n"
    plain, tagged = parse_text(text, schema, "t.csv"), parse_text(text, keyed, "t.csv")
    assert (table_of(tagged["a"].to_numpy()) == 3).all()
    assert ((tagged["a"].to_numpy() & LOW_MASK) == (plain["a"].to_numpy() & LOW_MASK)).all()
    bags = [np.asarray(v) for v in tagged["b"]]
    assert [len(b) for b in bags] == [2, 1]  # an empty bag holds the missing key
    assert all((table_of(b) == 5).all() for b in bags)
    assert bags[1][0] == (missing_key("b") & LOW_MASK) | (5 << TABLE_SHIFT)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.text(max_size=12)), max_size=24),
    st.lists(st.tuples(st.sampled_from(["C1", "C2", "shared"]), st.integers(0, MAX_TABLES)),
             min_size=1, max_size=4),
    st.booleans(),
)  # fmt: skip
def test_rows_of_cells_key_as_each_field_alone(cells, rules, tagged):
    """``FieldKeys.hash_rows`` (the online request's one pass) is :meth:`FieldKeys.hash` of
    each field's column: the same salt, the same table tag, missing cells alike."""
    salts = tuple(s for s, _ in rules)
    keying = FieldKeys(salts, tuple(t for _, t in rules) if tagged else None)
    nf = len(rules)
    cells = cells[: len(cells) // nf * nf]
    got = keying.hash_rows(pa.array(cells, pa.large_string()))
    assert got.shape == (len(cells) // nf, nf) and got.dtype == np.int64
    for j in range(nf):
        assert got[:, j].tolist() == keying.hash(pa.array(cells[j::nf], pa.string()), j).tolist()

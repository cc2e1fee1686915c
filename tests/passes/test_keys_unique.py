"""``unique_counts`` against its model, ``np.unique(values, return_counts=True)``."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from daskhps.passes.keys import unique_counts

_INT64 = st.integers(-(2**63), 2**63 - 1)


@given(arrays(np.int64, st.integers(0, 300), elements=st.one_of(st.integers(-5, 5), _INT64)))
def test_unique_counts_is_np_unique_with_counts(values: np.ndarray) -> None:
    keys, counts = unique_counts(values)
    want_keys, want_counts = np.unique(values, return_counts=True)
    assert keys.dtype == np.int64 and counts.dtype == np.int64
    np.testing.assert_array_equal(keys, want_keys)
    np.testing.assert_array_equal(counts, want_counts)

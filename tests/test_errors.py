"""Every daskhps error survives the trip from a Dask worker to the client with its type."""

from __future__ import annotations

import inspect

import distributed.protocol.pickle as dask_pickle
import pytest

import daskhps.distributed._errors as distributed_errors
import daskhps.errors as errors

CLASSES = [
    c
    for mod in (errors, distributed_errors)
    for _, c in inspect.getmembers(mod, inspect.isclass)
    if issubclass(c, errors.DaskHPSError)
]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_error_round_trips_through_dask_pickle(cls: type[Exception]) -> None:
    err = cls("table 'ads': something went wrong; do this")
    back = dask_pickle.loads(dask_pickle.dumps(err))
    assert type(back) is cls
    assert "do this" in str(back)

"""The values of a chunk of imported rows: finite floats, a sound optimizer state, each key
once and, with several tables, each key its table's. Vectorised over the chunk; the first
problem found ends the import in one line naming the file and the row."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from daskhps.data.keyspace import TABLE_SHIFT, table_of
from daskhps.errors import DataError
from daskhps.importing.source import Chunk
from daskhps.table.spec import TableSpec

__all__ = [
    "check_chunk",
    "check_table_keys",
    "duplicate_error",
    "duplicate_pair",
    "first_non_finite",
]

_FIX = "fix or drop that row"
_DROP_STATE = "fix the state, or leave it out (then every row starts with the initial state)"


def first_non_finite(block: np.ndarray) -> int | None:
    """Index of the first row of ``float32[n, w]`` holding a NaN or an infinity, or None.

    One float64 sum per row finds them: a sum of finite float32 values (at most 3.4e38 each)
    stays finite in float64 (up to 1.8e308), and any NaN or infinity makes it NaN or infinite."""
    if block.shape[1] == 0:
        return None
    bad = np.flatnonzero(~np.isfinite(block.sum(axis=1, dtype=np.float64)))
    return int(bad[0]) if bad.size else None


def _first_row(mask: np.ndarray) -> int | None:
    rows = np.flatnonzero(mask.any(axis=1))
    return int(rows[0]) if rows.size else None


def _non_finite_message(where: str, what: str, row: np.ndarray, offset: int = 0) -> str:
    j = int(np.flatnonzero(~np.isfinite(row))[0])
    return (
        f"{where}: the {what} holds {row[j]} (column {offset + j}); every value must be a "
        f"finite float: {_FIX}"
    )


def _state_problem(state: np.ndarray, chunk: Chunk, spec: TableSpec) -> tuple[int, str] | None:
    """The first row of a bad optimizer state and what is wrong with it."""
    d = spec.dim
    adam = spec.optimizer.kind == "adam"
    floats = state[:, : 2 * d] if adam else state
    found: list[tuple[int, str]] = []
    i = first_non_finite(floats)
    if i is not None:
        found.append((i, _non_finite_message(chunk.state_row(i), "optimizer state", floats[i])))
    # Adagrad's accumulator and Adam's second moment are sums of squares: never negative.
    squares = state[:, d : 2 * d] if adam else state
    name = "Adam second moment" if adam else "Adagrad accumulator"
    first = d if adam else 0
    i = _first_row(squares < 0)
    if i is not None:
        j = int(np.flatnonzero(squares[i] < 0)[0])
        found.append(
            (
                i,
                f"{chunk.state_row(i)}: the {name} (state column {first + j}) is "
                f"{squares[i, j]}; a sum of squared gradients is never negative: {_DROP_STATE}",
            )
        )
    if adam:
        steps = state[:, 2 * d].view(np.int32)  # the step count's int32 bits
        bad = np.flatnonzero(steps < 0)
        if bad.size:
            i = int(bad[0])
            found.append(
                (
                    i,
                    f"{chunk.state_row(i)}: Adam's step (state column {2 * d}, an int32 bit "
                    f"pattern) is {int(steps[i])}; it counts updates and is never negative: "
                    f"{_DROP_STATE}",
                )
            )
    return min(found) if found else None


def duplicate_pair(keys: np.ndarray) -> tuple[int, int] | None:
    """Two positions of one key that ``keys`` holds more than once (the smaller key's), or
    None when every key is distinct."""
    order = np.argsort(keys)
    ordered = keys[order]
    same = np.flatnonzero(ordered[1:] == ordered[:-1])
    if not same.size:
        return None
    a, b = int(order[same[0]]), int(order[same[0] + 1])
    return min(a, b), max(a, b)


def duplicate_error(key: int, first: str, second: str) -> DataError:
    return DataError(
        f"duplicate key {key}: {first} and {second}; a table holds each key once: drop one of "
        "the two rows"
    )


def check_chunk(chunk: Chunk, spec: TableSpec) -> None:
    """:class:`DataError` for the first bad value of ``chunk``, or for a key it holds twice."""
    problems: list[tuple[int, str]] = []
    i = first_non_finite(chunk.weights)
    if i is not None:
        problems.append(
            (i, _non_finite_message(chunk.weight_row(i), "embedding", chunk.weights[i]))
        )
    if chunk.state is not None:
        found = _state_problem(chunk.state, chunk, spec)
        if found is not None:
            problems.append(found)
    if problems:
        raise DataError(min(problems)[1])
    pair = duplicate_pair(chunk.keys)
    if pair is not None:
        a, b = pair
        raise duplicate_error(int(chunk.keys[a]), chunk.key_row(a), chunk.key_row(b))


def check_table_keys(chunk: Chunk, index: int, names: Sequence[str]) -> None:
    """:class:`DataError` for the first key of ``chunk`` (rows of table ``index`` of the
    tables ``names``) that does not carry that index in bits 56..62, as every key of a run
    with several tables does (:mod:`daskhps.data.keyspace`). Such a key would be stored in
    this table and never read: the run looks it up in the table its bits name."""
    tags = table_of(chunk.keys)
    bad = np.flatnonzero(tags != index)
    if not bad.size:
        return
    i = int(bad[0])
    key, tag = int(chunk.keys[i]), int(tags[i])
    if tag < 0:
        what = "is negative, so it carries no table"
    elif tag < len(names):
        what = f"carries table {tag} ({names[tag]}) in bits {TABLE_SHIFT}..62"
    else:
        what = f"carries table {tag} in bits {TABLE_SHIFT}..62, and there are {len(names)}"
    name = names[index]
    raise DataError(
        f"{chunk.key_row(i)}: key {key} {what}, but these are the rows of table {name!r} "
        f"(table {index}); with several tables every key carries its table's index in bits "
        f"{TABLE_SHIFT}..62: give table {name!r} its own keys (the keys-{name}.npy of an "
        "export of a run with these tables), hashed and tagged as daskhps.data.keyspace makes "
        "them"
    )

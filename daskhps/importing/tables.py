"""Which rows go to which table: the sources an import's arguments name, one per table.

With one table (no ``tables:`` section, or one that leaves no field to the default table)
``--rows``, ``--keys`` and ``--state`` name that table's files as they always did. With several,
each value is ``TABLE=PATH`` (``--rows ids=embeddings-ids.npy small=embeddings-small.npy``,
the files ``daskhps export`` writes per table); a table may be named several times in
``--rows`` (parquet files, folders, globs), at most once in ``--keys`` and ``--state``. A table
given no rows starts empty, as in a new run. Everything here reads the arguments only: a wrong
table name fails before any file is opened.
"""

from __future__ import annotations

from collections.abc import Sequence

from daskhps.config import RunConfig
from daskhps.errors import DataError
from daskhps.importing.source import Source, open_source

__all__ = ["open_sources"]

_FLAGS = ("--rows", "--keys", "--state")


def _by_table(
    flag: str, values: Sequence[str], names: Sequence[str], config: RunConfig
) -> dict[str, list[str]]:
    """``flag``'s ``TABLE=PATH`` values grouped by table (a path may hold ``=`` itself: the
    table is the text before the first one)."""
    out: dict[str, list[str]] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise DataError(
                f"{flag} {value}: {config.source} has {len(names)} tables ({', '.join(names)}), "
                f"so each file is given as TABLE=PATH (e.g. {flag} {names[0]}=PATH); name the "
                "table this file belongs to"
            )
        if name not in names:
            raise DataError(
                f"{flag} {value}: {config.source} has no table {name!r} (its tables: "
                f"{', '.join(names)}); give each file as TABLE=PATH with one of them"
            )
        out.setdefault(name, []).append(path)
    return out


def _only(flag: str, values: Sequence[str] | None, table: str | None) -> str | None:
    """The one file ``flag`` gives (for ``table`` when set), or None."""
    if not values:
        return None
    if len(values) > 1:
        at = "" if table is None else f"{table}="
        shown = " ".join(at + v for v in values)
        raise DataError(f"{flag} {shown}: give one .npy file (per table) to {flag}")
    return values[0]


def open_sources(
    config: RunConfig,
    rows: Sequence[str],
    *,
    keys: Sequence[str] | None = None,
    state: Sequence[str] | None = None,
    key_column: str = "key",
    embedding_column: str = "embedding",
    state_column: str = "state",
) -> dict[str, Source]:
    """Per table given rows, in table order, the source of its rows (see the module
    docstring); nothing is read yet. Raises :class:`DataError` in one line."""
    columns = {
        "key_column": key_column,
        "embedding_column": embedding_column,
        "state_column": state_column,
    }
    if not config.several_tables:
        spec = config.table_spec()
        one = open_source(
            spec,
            rows,
            keys=_only("--keys", keys, None),
            state=_only("--state", state, None),
            **columns,
        )
        return {spec.name: one}
    specs = config.table_specs()
    names = [s.name for s in specs]
    given = {
        flag: _by_table(flag, values or (), names, config)
        for flag, values in zip(_FLAGS, (rows, keys, state), strict=True)
    }
    for flag in _FLAGS[1:]:
        for name, paths in given[flag].items():
            if name not in given["--rows"]:
                raise DataError(
                    f"{flag} {name}={paths[0]}: no --rows {name}=... gives table {name!r} its "
                    f"rows; give them, or leave out {flag} {name}={paths[0]}"
                )
    listed = len(config.tables)  # the tables: entries; the default table (if any) comes last
    sources: dict[str, Source] = {}
    for i, spec in enumerate(specs):
        if spec.name not in given["--rows"]:
            continue
        sources[spec.name] = open_source(
            spec,
            given["--rows"][spec.name],
            keys=_only("--keys", given["--keys"].get(spec.name), spec.name),
            state=_only("--state", given["--state"].get(spec.name), spec.name),
            table=spec.name,
            dim_key=f"tables[{i}].dim" if i < listed else "table.dim",
            **columns,
        )
    return sources

"""Key statistics that size a run: distinct keys per owner, and each pass's working set.

Three sources, in order of trust::

    scan       read the training logs and count, with the trainer's own planning functions
               (daskhps.passes: build_plan, pass_keys, owner_keys), so the counts are the keys
               each worker will stage, per pass, and store.
    expected   table.expected_keys from the config (the user's count of distinct keys).
    bound      an upper bound from the data's shape: examples x fields, or the vocabularies
               of generated logs.

A per-worker figure from a total spreads it over the worker's share of the virtual shards,
with three standard deviations of binomial spread on top.

With several tables (``tables:``) every figure is also given per table (:class:`TableKeys`):
a pass pins each table's keys in that table's own device tier, so each table's largest pass
per worker must fit its own rows. The scan counts a table's keys by the index every key
carries (``key >> 56``, :func:`daskhps.data.keyspace.table_of`); the config bounds them per
table where the data's shape does (each field's vocabulary of generated logs; a
``shared_keys`` table's is the sum of its fields'), and ``table.expected_keys``, the run's
distinct keys over all its tables, bounds each table's from above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from daskhps.config import RunConfig
from daskhps.data.keyspace import table_of
from daskhps.sharding import ShardMap

__all__ = ["KeyStats", "TableKeys", "expected_key_stats", "scan_key_stats"]

Source = Literal["scan", "expected", "bound", "unknown"]


@dataclass(frozen=True)
class TableKeys:
    """The key statistics of one table of a run with several (:attr:`KeyStats.tables`)."""

    name: str
    source: Source
    distinct_keys: int | None
    keys_per_owner: int | None
    largest_pass_keys: int | None
    largest_pass_per_owner: int | None
    pass_keys_per_owner: tuple[int, ...] = ()

    @property
    def certain(self) -> bool:
        return self.source in ("scan", "expected")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["pass_keys_per_owner"] = list(self.pass_keys_per_owner)
        return out


@dataclass(frozen=True)
class KeyStats:
    """Distinct keys of the table and of its passes, per owner (worker).

    ``source`` says how much to trust the figures (see the module docstring); a figure is None
    when it cannot be known from the config alone.
    """

    source: Source
    workers: int
    examples: int | None
    passes: int | None
    distinct_keys: int | None
    keys_per_owner: int | None
    largest_pass_keys: int | None
    largest_pass_per_owner: int | None
    pass_keys_per_owner: tuple[int, ...] = ()  # sum over owners' maxima is not needed: max only
    # With several tables, each table's figures (the ones above are their sums over tables,
    # per owner); empty with one table, whose figures are the ones above.
    tables: tuple[TableKeys, ...] = ()

    @property
    def certain(self) -> bool:
        """Counted or stated by the user: a run refused on these is refused rightly."""
        return self.source in ("scan", "expected")

    def by_table(self, names: Sequence[str]) -> tuple[TableKeys, ...]:
        """Per table of ``names`` (the run's tables in index order): :attr:`tables`, or with
        one table the run's figures as that table's."""
        if self.tables:
            return self.tables
        (name,) = names
        return (
            TableKeys(
                name,
                self.source,
                self.distinct_keys,
                self.keys_per_owner,
                self.largest_pass_keys,
                self.largest_pass_per_owner,
                self.pass_keys_per_owner,
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["pass_keys_per_owner"] = list(self.pass_keys_per_owner)
        del out["tables"]  # the report lists the tables, each with its keys
        return out


def owner_share(total: int, shard_map: ShardMap) -> int:
    """Keys the busiest worker gets of ``total`` keys spread over the virtual shards."""
    counts = [0] * shard_map.num_workers
    for s in range(shard_map.num_shards):
        counts[s * shard_map.num_workers // shard_map.num_shards] += 1
    p = max(counts) / shard_map.num_shards
    if p >= 1.0:
        return total
    return min(total, math.ceil(total * p + 3.0 * math.sqrt(total * p * (1.0 - p))))


def _training_rows(cfg: RunConfig) -> int | None:
    """Training examples of generated logs (the holdout day excluded); None for files."""
    gen = cfg.data.generate
    if gen is None:
        return None
    days = gen.generator.days
    rows = days * gen.generator.rows_per_day
    h = cfg.data.holdout
    if h is not None and h.day is not None:
        rows -= gen.generator.rows_per_day
    elif h is not None and h.fraction is not None:
        rows = int(rows * (1.0 - h.fraction))
    return rows


def _generated_keys(cfg: RunConfig, examples: int) -> int:
    """Most distinct keys ``examples`` rows of generated logs can hold: per field, its
    vocabulary or the row count, whichever is smaller, plus one key for a missing value."""
    gen = cfg.data.generate
    assert gen is not None
    return int(sum(min(int(v), examples) + 1 for v in gen.generator.vocab()))


def _table_generated_keys(
    cfg: RunConfig, fields: Sequence[int], shared: bool, examples: int
) -> int:
    """:func:`_generated_keys` of one table's ``fields`` (schema positions): a ``shared``
    table's fields hash into one key space, so they share one missing key and their
    vocabularies add up."""
    gen = cfg.data.generate
    assert gen is not None
    vocab = gen.generator.vocab()
    seen = sum(min(int(vocab[f]), examples) for f in fields)
    return int(seen + (1 if shared else len(fields)))


def _with_expected(expected: int, distinct: int | None, pass_keys: int | None) -> tuple[int, int]:
    """A table's distinct and pass keys under the run's ``expected`` keys of all tables (no
    table has more; bags of unknown length: a pass may hold every one)."""
    distinct = expected if distinct is None else min(distinct, expected)
    return distinct, distinct if pass_keys is None else min(pass_keys, distinct)


def _tables_expected(
    cfg: RunConfig, shard_map: ShardMap, examples: int | None, per_pass: int
) -> tuple[TableKeys, ...]:
    """Each table's bounds from the config: its fields' vocabularies (generated logs) or a
    pass's examples x its fields (single-valued fields), under ``table.expected_keys``."""
    schema = cfg.data.schema
    at = cfg.field_tables()
    expected = cfg.table.expected_keys
    max_ws = cfg.passes.plan.max_working_set
    out = []
    for t, entry in enumerate(cfg.embedding_tables()):
        fields = [f for f, i in enumerate(at) if i == t]
        multi = any(schema.categorical[f].multi_hot for f in fields)
        distinct: int | None = None
        pass_keys: int | None = None
        if cfg.data.generate is not None:
            assert examples is not None
            distinct = _table_generated_keys(cfg, fields, entry.shared_keys, examples)
            pass_keys = _table_generated_keys(cfg, fields, entry.shared_keys, per_pass)
        elif not multi:
            pass_keys = per_pass * len(fields)
        if expected is not None:
            distinct, pass_keys = _with_expected(expected, distinct, pass_keys)
        if max_ws is not None:
            pass_keys = max_ws if pass_keys is None else min(pass_keys, max_ws)
        source: Source = "bound" if pass_keys is not None or distinct is not None else "unknown"
        out.append(
            TableKeys(
                name=entry.name,
                source=source,
                distinct_keys=distinct,
                keys_per_owner=None if distinct is None else owner_share(distinct, shard_map),
                largest_pass_keys=pass_keys,
                largest_pass_per_owner=(
                    None if pass_keys is None else owner_share(pass_keys, shard_map)
                ),
            )
        )
    return tuple(out)


def expected_key_stats(cfg: RunConfig, workers: int) -> KeyStats:
    """Key statistics from the config: ``table.expected_keys``, else bounds from the data;
    with several tables, each table's too (:class:`TableKeys`: bounds)."""
    plan = cfg.passes.plan
    shard_map = ShardMap(plan.num_shards, workers)
    fields = len(cfg.data.schema.categorical_names)
    multi = any(f.multi_hot for f in cfg.data.schema.categorical)
    examples = _training_rows(cfg)
    per_pass = plan.examples_per_pass if examples is None else min(plan.examples_per_pass, examples)
    expected = cfg.table.expected_keys
    tables = _tables_expected(cfg, shard_map, examples, per_pass) if cfg.several_tables else ()
    source: Source
    distinct: int | None
    pass_keys: int | None
    if expected is not None:
        source, distinct = "expected", expected
        pass_keys = min(expected, per_pass * fields) if not multi else expected
    elif tables:  # the tables' bounds add up (a shared table's fields share their keys)
        known = [t for t in tables if t.distinct_keys is not None]
        distinct = sum(t.distinct_keys or 0 for t in known) if len(known) == len(tables) else None
        each = [t.largest_pass_keys for t in tables]
        pass_keys = None if None in each else sum(p or 0 for p in each)
        source = "bound" if pass_keys is not None else "unknown"
    elif cfg.data.generate is not None:
        assert examples is not None
        source, distinct = "bound", _generated_keys(cfg, examples)
        pass_keys = _generated_keys(cfg, per_pass)
    elif not multi:
        source, distinct, pass_keys = "bound", None, per_pass * fields
    else:  # bags of unknown length: no bound from the config
        source, distinct, pass_keys = "unknown", None, None
    if plan.max_working_set is not None and pass_keys is not None:
        pass_keys = min(pass_keys, plan.max_working_set)
    elif plan.max_working_set is not None:
        pass_keys = plan.max_working_set
    passes = None if examples is None else -(-examples // plan.examples_per_pass)
    return KeyStats(
        source=source,
        workers=workers,
        examples=examples,
        passes=passes,
        distinct_keys=distinct,
        keys_per_owner=None if distinct is None else owner_share(distinct, shard_map),
        largest_pass_keys=pass_keys,
        largest_pass_per_owner=None if pass_keys is None else owner_share(pass_keys, shard_map),
        tables=tables,
    )


def _table_counts(part: Any, tables: int) -> np.ndarray:
    """Keys of one owner partition per table (one table: its length; its keys are untagged)."""
    if tables == 1:
        return np.array([len(part)], dtype=np.int64)
    return np.bincount(table_of(part["key"].to_numpy(np.int64)), minlength=tables)


def scan_key_stats(cfg: RunConfig, workers: int, scheduler: str = "threads") -> KeyStats:
    """Count the keys of the training logs as the trainer will plan them for ``workers``.

    Streams the logs with Dask's local ``scheduler`` (no cluster needed): one read for the
    pass plan (rows per partition; ``max_working_set`` splits read the candidate passes' keys),
    then one for every pass's unique keys per owner and the distinct keys per owner over the
    whole log (the passes and the total share each partition's read). Only keys are held, never
    the log's rows, so a log larger than memory can be scanned. With several tables each
    owner's keys are counted per table (the index in each key's bits 56..62).
    """
    # Loaded here: only --scan reads logs with Dask; the estimate and the trainer's check_fits
    # need none of it.
    import dask

    from daskhps.data.holdout import read_train_and_holdout
    from daskhps.passes import build_plan, owner_keys, pass_keys

    if cfg.data.generate is not None:
        cfg.data.generate.ensure()
    plan_cfg = cfg.passes.plan
    names = [t.name for t in cfg.embedding_tables()]
    T = len(names)
    with dask.config.set(scheduler=scheduler):
        train, _ = read_train_and_holdout(
            cfg.data.source, cfg.data.holdout, cfg.data.backend, cfg.data.block_size
        )
        plan = build_plan(train, plan_cfg, workers, seed=cfg.run.seed)
        shard_map = ShardMap(plan_cfg.num_shards, workers)
        lengths = plan.partition_lengths

        def per_owner(start: int, stop: int) -> Any:
            keys = pass_keys(train, lengths, start, stop)
            # p2p needs a distributed cluster; the counts do not depend on the method.
            owned = owner_keys(keys, shard_map, "tasks")
            return [dask.delayed(_table_counts)(part, T) for part in owned.to_delayed()]

        jobs = [per_owner(p.start, p.stop) for p in plan.passes]
        jobs.append(per_owner(0, plan.num_examples))
        counts = dask.compute(*jobs)
    # [owner, table] per pass, and over the whole log
    passes = [np.array(cs, dtype=np.int64).reshape(workers, T) for cs in counts[:-1]]
    total = np.array(counts[-1], dtype=np.int64).reshape(workers, T)

    def figures(p: list[np.ndarray], whole: np.ndarray) -> dict[str, Any]:
        biggest = tuple(int(a.max(initial=0)) for a in p)
        return {
            "distinct_keys": int(whole.sum()),
            "keys_per_owner": int(whole.max(initial=0)),
            "largest_pass_keys": max((int(a.sum()) for a in p), default=0),
            "largest_pass_per_owner": max(biggest, default=0),
            "pass_keys_per_owner": biggest,
        }

    tables: tuple[TableKeys, ...] = ()
    if T > 1:
        tables = tuple(
            TableKeys(name, "scan", **figures([a[:, t] for a in passes], total[:, t]))
            for t, name in enumerate(names)
        )
    return KeyStats(
        source="scan",
        workers=workers,
        examples=plan.num_examples,
        passes=len(plan.passes),
        **figures([a.sum(axis=1) for a in passes], total.sum(axis=1)),
        tables=tables,
    )

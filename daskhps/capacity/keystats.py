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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from daskhps.config import RunConfig
from daskhps.sharding import ShardMap

__all__ = ["KeyStats", "expected_key_stats", "scan_key_stats"]

Source = Literal["scan", "expected", "bound", "unknown"]


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

    @property
    def certain(self) -> bool:
        """Counted or stated by the user: a run refused on these is refused rightly."""
        return self.source in ("scan", "expected")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["pass_keys_per_owner"] = list(self.pass_keys_per_owner)
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


def expected_key_stats(cfg: RunConfig, workers: int) -> KeyStats:
    """Key statistics from the config: ``table.expected_keys``, else bounds from the data."""
    plan = cfg.passes.plan
    shard_map = ShardMap(plan.num_shards, workers)
    fields = len(cfg.data.schema.categorical_names)
    multi = any(f.multi_hot for f in cfg.data.schema.categorical)
    examples = _training_rows(cfg)
    per_pass = plan.examples_per_pass if examples is None else min(plan.examples_per_pass, examples)
    expected = cfg.table.expected_keys
    source: Source
    if expected is not None:
        source, distinct = "expected", expected
        pass_keys = min(expected, per_pass * fields) if not multi else expected
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
    )


def scan_key_stats(cfg: RunConfig, workers: int, scheduler: str = "threads") -> KeyStats:
    """Count the keys of the training logs as the trainer will plan them for ``workers``.

    Streams the logs with Dask's local ``scheduler`` (no cluster needed): one read for the
    pass plan (rows per partition; ``max_working_set`` splits read the candidate passes' keys),
    then one for every pass's unique keys per owner and the distinct keys per owner over the
    whole log (the passes and the total share each partition's read). Only keys are held, never
    the log's rows, so a log larger than memory can be scanned.
    """
    # Loaded here: only --scan reads logs with Dask; the estimate and the trainer's check_fits
    # need none of it.
    import dask

    from daskhps.data.holdout import read_train_and_holdout
    from daskhps.passes import build_plan, owner_keys, pass_keys

    if cfg.data.generate is not None:
        cfg.data.generate.ensure()
    plan_cfg = cfg.passes.plan
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
            return [dask.delayed(len)(part) for part in owned.to_delayed()]

        jobs = [per_owner(p.start, p.stop) for p in plan.passes]
        jobs.append(per_owner(0, plan.num_examples))
        counts = dask.compute(*jobs)
    passes = [tuple(int(c) for c in cs) for cs in counts[:-1]]
    total = tuple(int(c) for c in counts[-1])
    biggest = [max(p, default=0) for p in passes]
    return KeyStats(
        source="scan",
        workers=workers,
        examples=plan.num_examples,
        passes=len(plan.passes),
        distinct_keys=sum(total),
        keys_per_owner=max(total, default=0),
        largest_pass_keys=max((sum(p) for p in passes), default=0),
        largest_pass_per_owner=max(biggest, default=0),
        pass_keys_per_owner=tuple(biggest),
    )

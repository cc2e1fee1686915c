"""Unique keys of a pass, routed to the worker that owns them.

::

    input partitions (files)   p0          p1          p2
    rows of the pass           [.....)     [.........) [...)        select_examples
    keys, deduplicated locally k k k       k k k k     k k          pass_keys
    route by owner worker      ---------- shuffle (set_index on worker, explicit divisions) --
    partition w                worker 0: its shards' keys | worker 1: ... | ...
    dedup + sort (global,      each key reaches exactly one partition, so a per-partition
    since owners are unique)   drop_duplicates is a global one                owner_keys
    partition w built on worker w (distributed)             placement.place_on_workers

``df.shuffle(on=...)`` hashes the column and would not put owner w in partition w, so the
routing uses ``set_index`` with divisions ``0, 1, ..., W``: partition w holds exactly the keys
whose owner is w.
"""

from __future__ import annotations

import logging
from typing import Any

import dask.dataframe as dd
import numpy as np
import pandas as pd

from daskhps._scheduler import scheduler_workers
from daskhps.data.readers import ClickLog
from daskhps.monitor.network import SOURCE, RouteAccount, account_shuffled
from daskhps.passes.keys import KEY_COLUMNS, pass_keys, select_examples
from daskhps.passes.plan import PassPlan, PassSpec
from daskhps.sharding import ShardMap
from daskhps.stages import stage_span

__all__ = [
    "owner_keys",
    "pass_keys",
    "plan_owner_keys",
    "select_examples",
    "worker_addresses",
]

log = logging.getLogger(__name__)


def _with_owner(
    df: pd.DataFrame, shard_map: ShardMap, account: RouteAccount | None = None
) -> pd.DataFrame:
    with stage_span("shuffle"):  # owner routing; Dask's own shuffle tasks show separately
        keys = df["key"].to_numpy()
        shard = shard_map.shard(keys)
        worker = (shard * shard_map.num_workers) // shard_map.num_shards
        out = pd.DataFrame(
            {
                "worker": worker,
                "shard": shard,
                "key": keys,
                "count": df["count"].to_numpy(),
                "day": df["day"].to_numpy(),
            }
        )
        if account is not None:  # the rank the keys leave from, for the network figures
            out[SOURCE] = np.int16(account.rank_here())
        return out


def _finish(
    df: pd.DataFrame, account: RouteAccount | None = None, partition_info: Any = None
) -> pd.DataFrame:
    """Global dedup (each key reaches one partition only) and sort by (shard, key): counts
    add up, the latest day stays. With ``account``, the bytes that reached this partition
    from other ranks are counted first (``daskhps.monitor.network``)."""
    if account is not None and partition_info is not None:
        df = account_shuffled(account, "pass_keys", df, partition_info["number"])
    with stage_span("dedup"):
        df = df.reset_index()
        keys, first, inverse = np.unique(
            df["key"].to_numpy(), return_index=True, return_inverse=True
        )
        count = np.zeros(len(keys), dtype=np.int64)
        np.add.at(count, inverse, df["count"].to_numpy())
        day = np.zeros(len(keys), dtype=np.int32)
        np.maximum.at(day, inverse, df["day"].to_numpy())
        shard = df["shard"].to_numpy()[first]
        order = np.lexsort((keys, shard))
        worker = df["worker"].to_numpy()[first][order]
        return pd.DataFrame(
            {
                "worker": worker,
                "shard": shard[order],
                "key": keys[order],
                "count": count[order],
                "day": day[order],
            }
        )


def owner_keys(
    keys: dd.DataFrame,
    shard_map: ShardMap,
    shuffle_method: str | None = None,
    account: RouteAccount | None = None,
) -> dd.DataFrame:
    """Route the keys of :func:`pass_keys` so partition ``w`` holds exactly worker ``w``'s.

    Columns ``worker, shard, key, count, day``; each partition sorted by ``(shard, key)`` and
    duplicate free, with each key's occurrences in the pass and its latest day.
    ``shuffle_method`` is passed to Dask (``tasks``, ``p2p``, ``disk`` or None). With
    ``account``, the bytes the keys take between ranks are counted (kind ``pass_keys``).
    """
    W = shard_map.num_workers
    columns = {"worker": "int64", "shard": "int64", **KEY_COLUMNS}
    meta = pd.DataFrame({k: pd.Series([], dtype=t) for k, t in columns.items()})
    tagged = meta if account is None else meta.assign(**{SOURCE: np.int16(0)}).iloc[:0]
    owned = keys.map_partitions(_with_owner, shard_map, account, meta=tagged)
    routed = owned.set_index("worker", divisions=list(range(W + 1)), shuffle_method=shuffle_method)
    return routed.map_partitions(_finish, account, meta=meta)


def plan_owner_keys(
    log_: ClickLog, plan: PassPlan, spec: PassSpec, shard_map: ShardMap
) -> dd.DataFrame:
    """:func:`owner_keys` of one pass of a plan."""
    keys = pass_keys(log_, plan.partition_lengths, spec.start, spec.stop)
    return owner_keys(keys, shard_map, plan.config.shuffle_method)


def worker_addresses(client: Any) -> list[str]:
    """Worker addresses in rank order (sorted by address, so every caller agrees)."""
    return sorted(scheduler_workers(client))

"""Pass settings: how the example stream is cut into passes and global batches."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from daskhps.data._validate import check_keys, get
from daskhps.errors import ConfigError

__all__ = ["SHUFFLE_METHODS", "PassConfig"]

SHUFFLE_METHODS = (None, "tasks", "p2p", "disk")


@dataclass(frozen=True)
class PassConfig:
    """How to plan passes. Nothing here depends on tier sizes.

    ``examples_per_pass``: examples per pass (the last pass may be shorter).
    ``global_batch_size``: examples per optimizer step over all workers.
    ``max_working_set``: optional cap on a pass's unique keys; a larger pass is split, at
    global-batch boundaries, into consecutive sub-passes that each fit.
    ``num_shards``: virtual shards of the key space (owner = mix(key) % num_shards).
    ``shuffle_examples``: permute examples within each pass (seeded by the plan seed).
    ``shuffle_method``: Dask shuffle for routing keys to owners (None lets Dask choose).
    """

    examples_per_pass: int
    global_batch_size: int
    max_working_set: int | None = None
    num_shards: int = 64
    shuffle_examples: bool = False
    shuffle_method: str | None = None

    _KEYS = (
        "examples_per_pass",
        "global_batch_size",
        "max_working_set",
        "num_shards",
        "shuffle_examples",
        "shuffle_method",
    )

    def __post_init__(self) -> None:
        if self.examples_per_pass < 1 or self.global_batch_size < 1:
            raise ConfigError("passes: examples_per_pass and global_batch_size must be >= 1")
        if self.global_batch_size > self.examples_per_pass:
            raise ConfigError(
                f"passes: global_batch_size ({self.global_batch_size}) must not exceed "
                f"examples_per_pass ({self.examples_per_pass})"
            )
        if self.max_working_set is not None and self.max_working_set < 1:
            raise ConfigError("passes: max_working_set must be >= 1 or null")
        if self.num_shards < 1:
            raise ConfigError("passes: num_shards must be >= 1")
        if self.shuffle_method not in SHUFFLE_METHODS:
            raise ConfigError(
                f"passes: shuffle_method {self.shuffle_method!r}: choose one of "
                f"{', '.join(map(repr, SHUFFLE_METHODS))}"
            )

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any], source: str = "<dict>", prefix: str = "passes"
    ) -> PassConfig:
        d = check_keys(d, cls._KEYS, source, prefix)
        try:
            return cls(
                examples_per_pass=get(d, "examples_per_pass", int, source, prefix, minimum=1),
                global_batch_size=get(d, "global_batch_size", int, source, prefix, minimum=1),
                max_working_set=get(
                    d, "max_working_set", (int, type(None)), source, prefix, None, minimum=1
                ),
                num_shards=get(d, "num_shards", int, source, prefix, 64, minimum=1),
                shuffle_examples=get(d, "shuffle_examples", bool, source, prefix, False),
                shuffle_method=get(
                    d, "shuffle_method", (str, type(None)), source, prefix, None, SHUFFLE_METHODS
                ),
            )
        except ConfigError as e:
            msg = str(e)
            raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None

"""Every kind of bad config is a ConfigError naming the file, the line and the dotted key."""

from __future__ import annotations

from pathlib import Path

import pytest

from daskhps.config import RunConfig, load_config
from daskhps.errors import ConfigError
from tests.config.helpers import MINIMAL, error, located, write

# (config text, dotted key, line, words the message must hold); a missing key is reported at
# the line of its section
CASES = [
    ("data:\n  generate: {}\ntabel: {}\n", "tabel", 3, "did you mean 'table'"),
    (MINIMAL + "table:\n  dimm: 8\n", "table.dimm", 4, "did you mean 'table.dim'"),
    (MINIMAL + "table:\n  dim: eight\n", "table.dim", 4, "expected int, got str"),
    (MINIMAL + "table:\n  dim: 0\n", "table.dim", 4, "must be >= 1"),
    (MINIMAL + "run:\n  quiet: 1\n", "run.quiet", 4, "expected bool"),
    (MINIMAL + "run:\n  name: 'a b'\n", "run.name", 4, "letters"),
    ("data:\n  generate:\n    days: 0\n", "data.generate.days", 3, "must be >= 1"),
    ("data:\n  generate:\n    ctr: 2\n", "data.generate.ctr", 3, "(0, 1)"),
    ("data:\n  generate: {}\n  block_size: lots\n", "data.block_size", 3, "'64MiB'"),
    ("data:\n  generate: {}\n  block_size: 100\n", "data.block_size", 3, "below 4 KiB"),
    ("data:\n  train: {paths: x}\n  generate: {}\n", "data", 1, "exactly one of train"),
    ("data:\n  train:\n    paths: []\n", "data.train.paths", 3, "non-empty"),
    ("data:\n  train:\n    paths: x\n    schema: criteo\n", "data.train.schema", 4, "unknown"),
    ("data:\n  train:\n    paths: x\n    days: [2024]\n", "data.train.days", 4, "YYYY-MM-DD"),
    ("data:\n  train: {paths: x}\n  schema: nope\n", "data.schema", 3, "not a builtin"),
    ("data:\n  train: {paths: x}\n  schema:\n    name: s\n", "data.schema.label", 3, "missing"),
    ("data:\n  train: {paths: x}\n  bad_rows: maybe\n", "data.bad_rows.action", 3, "skip"),
    ("data:\n  generate: {}\n  schema: {name: s, label: l, format: parquet, dense: [d]}\n",
     "data.schema", 3, "Criteo-format"),
    ("data:\n  train: {paths: x}\n  holdout: {day: last, fraction: 0.1}\n", "data.holdout", 3,
     "exactly one of day"),
    ("data:\n  train: {paths: x}\n  holdout:\n    fraction: 1.5\n", "data.holdout.fraction", 4,
     "must be < 1"),
    ("data:\n  train: {paths: x}\n  holdout:\n    day: monday\n", "data.holdout.day", 4,
     "last or YYYY-MM-DD"),
    ("data:\n  generate: {}\n  holdout:\n    day: last\n", "data.holdout.day", 4,
     "only generated day"),
    ("data:\n  generate: {days: 2}\n  holdout:\n    day: 2023-01-01\n", "data.holdout.day", 4,
     "not a generated day"),
    ("data:\n  train: {paths: x}\n  backend: gpu\n", "data.backend", 3, "'pandas'"),
    (MINIMAL + "passes:\n  global_batch_size: 10\n  examples_per_pass: 5\n",
     "passes.global_batch_size", 4, "must not exceed"),
    (MINIMAL + "passes:\n  shuffle_method: fast\n", "passes.shuffle_method", 4, "'p2p'"),
    (MINIMAL + "passes:\n  global_batch_size: 1\n", "passes.global_batch_size", 4,
     "smaller than cluster.n_workers"),
    (MINIMAL + "table:\n  optimizer:\n    kind: rmsprop\n", "table.optimizer.kind", 5, "'adam'"),
    (MINIMAL + "table:\n  optimizer:\n    kind: sgd\n    row_wise: true\n", "table.optimizer", 4,
     "adagrad only"),
    # the bound is declared on the key: the message names it and its line, not the section's
    (MINIMAL + "table:\n  optimizer:\n    beta1: 1.0\n", "table.optimizer.beta1", 5, "< 1"),
    (MINIMAL + "table:\n  optimizer:\n    lr: 0\n", "table.optimizer.lr", 5, "> 0"),
    (MINIMAL + "table:\n  tiers:\n    device: {rows: 10, fraction: 0.1}\n", "table.tiers.device",
     5, "not both"),
    (MINIMAL + "table:\n  tiers:\n    host: {fraction: -0.1}\n", "table.tiers.host.fraction", 5,
     ">= 0"),
    (MINIMAL + "table:\n  tiers:\n    device: {fraction: 1.2}\n", "table.tiers.device.fraction",
     5, "< 1"),
    (MINIMAL + "table:\n  tiers:\n    policy: fifo\n", "table.tiers.policy", 5, "'lfu'"),
    (MINIMAL + "table:\n  admission:\n    min_count: 0\n", "table.admission.min_count", 5,
     ">= 1, got 0"),
    (MINIMAL + "table:\n  admission:\n    probability: 1.5\n", "table.admission.probability",
     5, "(0, 1]"),
    (MINIMAL + "table:\n  expiry:\n    ttl_days: -1\n", "table.expiry.ttl_days", 5, ">= 1"),
    (MINIMAL + "table:\n  expiry:\n    max_rows: 0\n", "table.expiry.max_rows", 5, ">= 1"),
    (MINIMAL + "table:\n  expiry:\n    score: fifo\n", "table.expiry.score", 5, "'lru'"),
    # too short for a close match, but the one key it begins
    (MINIMAL + "table:\n  expiry:\n    ttl: 3\n", "table.expiry.ttl", 5,
     "did you mean 'table.expiry.ttl_days'?"),
    (MINIMAL + "table:\n  tiers:\n    device: {fraction: 0.5}\n    host: {fraction: 0.3}\n",
     "table.tiers", 4, "Dask pauses a worker at 80%"),
    (MINIMAL + "cluster: {memory_limit: 1GiB}\n"
     "table:\n  tiers:\n    device: {rows: 10000000}\n", "table.tiers", 5, "device.rows"),
    (MINIMAL + "passes: {max_working_set: 1000}\ntable:\n  tiers:\n    device:\n      rows: 100\n",
     "table.tiers.device.rows", 7, "max_working_set"),
    (MINIMAL + "model:\n  name: nosuch\n", "model.name", 4, "nosuch"),
    (MINIMAL + "model:\n  name: dlrm\n  options:\n    top_mlp: wide\n", "model.options.top_mlp",
     6, "top_mlp"),
    (MINIMAL + "model:\n  nam: dlrm\n", "model.nam", 4, "unknown key"),
    (MINIMAL + "dense_optimizer:\n  kind: lamb\n", "dense_optimizer.kind", 4, "'adagrad'"),
    (MINIMAL + "dense_optimizer:\n  warmup_steps: 10\n", "dense_optimizer.warmup_steps", 4,
     "warmup_constant"),
    (MINIMAL + "dense_optimizer:\n  schedule: warmup_constant\n", "dense_optimizer.warmup_steps",
     3, "needs warmup_steps"),
    (MINIMAL + "dense_optimizer:\n  grad_clip_norm: 0\n", "dense_optimizer.grad_clip_norm", 4,
     "> 0"),
    (MINIMAL + "cluster:\n  address: tcp://h:1\n  n_workers: 4\n", "cluster.n_workers", 5,
     "LocalCluster only"),
    (MINIMAL + "cluster:\n  memory_limit: lots\n", "cluster.memory_limit", 4, "4GiB"),
    (MINIMAL + "cluster:\n  memory_limit: 1000\n", "cluster.memory_limit", 4, "64 MiB"),
    (MINIMAL + "cluster:\n  gpu: maybe\n", "cluster.gpu", 4, "false, true or auto"),
    (MINIMAL + "cluster:\n  dist_backend: nccl\n", "cluster.dist_backend", 4, "gpu: true"),
    (MINIMAL + "cluster:\n  dist_timeout_s: 0\n", "cluster.dist_timeout_s", 4, "> 0"),
    (MINIMAL + "eval:\n  metrics: [auc, f1]\n", "eval.metrics[1]", 4, "'f1' is not a metric"),
    (MINIMAL + "eval:\n  batch_size: 0\n", "eval.batch_size", 4, ">= 1"),
    (MINIMAL + "eval: []\n", "eval", 3, "expected a mapping"),
    (MINIMAL + "eval:\n  best_by: calibration\n", "eval.best_by", 4,
     "choose from null, auc, logloss, ne"),
    (MINIMAL + "eval:\n  patience: 2\n  best_by: null\n", "eval.patience", 4, "set eval.best_by"),
    (MINIMAL + "eval:\n  patience: 2\n  every_pass: false\n", "eval.patience", 4,
     "every_pass: true"),
    (MINIMAL + "eval:\n  patience: 0\n", "eval.patience", 4, ">= 1"),
    (MINIMAL + "eval:\n  diverge_factor: 1\n", "eval.diverge_factor", 4, "> 1"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "key", "line", "words"), CASES, ids=[c[1] for c in CASES])
def test_error_names_file_line_key(
    tmp_path: Path, text: str, key: str, line: int, words: str
) -> None:
    msg = error(tmp_path, text)
    assert located(msg, tmp_path / "run.yaml", key, line), msg
    assert words in msg, msg
    assert "\n" not in msg


def test_dict_source_is_named() -> None:
    with pytest.raises(ConfigError, match=r"^job\.yaml: table\.dim: must be >= 1"):
        RunConfig.from_dict({"data": {"generate": {}}, "table": {"dim": 0}}, source="job.yaml")


def test_unreadable_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(tmp_path / "missing.yaml")
    path = write(tmp_path, "data:\n  generate: {days: 1\n")
    with pytest.raises(ConfigError, match=rf"^{path}:3: not valid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))

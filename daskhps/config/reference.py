"""The configuration reference: type, default and meaning of every key, rendered as the tables
of docs/configuration.md. Defaults are read from the loader (a minimal config, resolved), so
the document cannot disagree with the code; a test checks both ways.

Regenerate the document with ``python -m daskhps.config.reference docs/configuration.md``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from daskhps.config._keys import key_tree

__all__ = ["DOCS", "defaults", "render", "update_document"]

# key: (type, meaning) or (type, meaning, default shown when it depends on other keys)
DOCS: dict[str, tuple[str, ...]] = {
    "run.name": ("str", "Run name: letters, digits, `-_.`.", "the config file's name"),
    "run.dir": ("path", "Run directory: metrics, checkpoints, logs.", "`runs/<run.name>`"),
    "run.seed": ("int >= 0", "Default of every other seed (table, holdout)."),
    "run.quiet": ("bool", "No progress output on the terminal."),
    "data.train": (
        "mapping",
        "Click logs to train on. Exactly one of `train` or `generate`.",
        "one of train, generate",
    ),
    "data.train.paths": ("path or list", "Files, folders or globs.", "required"),
    "data.train.days": ("[YYYY-MM-DD, YYYY-MM-DD]", "Keep `day=` partitions in this range."),
    "data.train.require_complete": ("bool", "Keep only days with a `_SUCCESS` marker."),
    "data.generate": (
        "mapping",
        "Synthetic Criteo-format logs to generate or reuse.",
        "one of train, generate",
    ),
    "data.generate.out": ("path", "Folder of the generated logs.", "`<run.dir>/data`"),
    "data.generate.workers": ("int or null", "Generator threads (null: all cores)."),
    "data.generate.days": ("int >= 1", "Days to generate."),
    "data.generate.rows_per_day": ("int >= 1", "Rows per day."),
    "data.generate.parts_per_day": ("int >= 1", "Files per day."),
    "data.generate.seed": ("int >= 0", "Generator seed (independent of `run.seed`)."),
    "data.generate.start_day": ("YYYY-MM-DD", "First day."),
    "data.generate.exponent": ("float > 0", "Power-law exponent of categorical values."),
    "data.generate.vocab_scale": ("float > 0", "Scales every field's vocabulary."),
    "data.generate.signal": ("float >= 0", "Strength of the planted signal (0: none)."),
    "data.generate.ctr": ("float in (0, 1)", "Target click-through rate."),
    "data.generate.gzip": ("bool", "Write `.tsv.gz` parts."),
    "data.schema": (
        "name, path or mapping",
        "Schema of the logs: `criteo`, a schema file (beside the config first) or inline.",
    ),
    "data.bad_rows": ("`skip`, `fail` or mapping", "What to do with malformed rows."),
    "data.bad_rows.action": ("`skip` or `fail`", "Drop and count, or stop at the first."),
    "data.bad_rows.max_fraction": ("float >= 0", "Fail when more of one file is bad."),
    "data.holdout": ("mapping or null", "Rows held out for evaluation; null: none."),
    "data.holdout.day": (
        "`last`, YYYY-MM-DD or null",
        "Hold out one day (not trained on).",
        "one of day, fraction",
    ),
    "data.holdout.fraction": (
        "float in (0, 1) or null",
        "Hold out this fraction of rows.",
        "one of day, fraction",
    ),
    "data.holdout.seed": ("int >= 0", "Seed of the fraction split.", "`run.seed`"),
    "data.backend": ("`auto`, `pandas` or `cudf`", "Dataframe backend (auto: cudf on GPU)."),
    "data.block_size": (
        "bytes, a size (`64MiB`) or null",
        "Read plain-text files larger than this in blocks (one partition each); null: whole.",
    ),
    "passes.epochs": ("int >= 1", "Times every training row is trained on."),
    "passes.examples_per_pass": ("int >= 1", "Examples per pass (the last may be shorter)."),
    "passes.global_batch_size": ("int >= 1", "Examples per optimizer step over all workers."),
    "passes.max_working_set": ("int or null", "Split passes with more unique keys than this."),
    "passes.num_shards": ("int >= 1", "Virtual shards of the key space."),
    "passes.shuffle_examples": ("bool", "Permute examples within each pass."),
    "passes.shuffle_method": ("`tasks`, `p2p`, `disk` or null", "Dask shuffle of the keys."),
    "table.name": ("str", "Table name (store paths, messages)."),
    "table.dim": ("int >= 1", "Embedding dim; the model may add columns (`sparse_dim`)."),
    "table.optimizer": ("mapping", "Sparse optimizer; its state lives in the row."),
    "table.optimizer.kind": ("`sgd`, `adagrad` or `adam`", "Sparse optimizer kind."),
    "table.optimizer.lr": ("float > 0", "Learning rate of the embeddings."),
    "table.optimizer.row_wise": ("bool", "Adagrad with one accumulator per row."),
    "table.optimizer.eps": ("float > 0", "Adagrad/Adam epsilon."),
    "table.optimizer.initial_accumulator": ("float >= 0", "Adagrad's starting accumulator."),
    "table.optimizer.beta1": ("float in [0, 1)", "Adam's first-moment decay."),
    "table.optimizer.beta2": ("float in [0, 1)", "Adam's second-moment decay."),
    "table.seed": ("int >= 0", "Initialisation seed: a row starts as f(seed, key).", "`run.seed`"),
    "table.init_scale": ("float >= 0 or null", "Uniform init bound; null: `1/sqrt(dim)`."),
    "table.tiers": ("mapping", "The tier stack of every worker's shard."),
    "table.tiers.device": ("mapping", "Device cache per worker: `rows` or `fraction`."),
    "table.tiers.device.rows": ("int >= 1 or null", "Rows of the device cache."),
    "table.tiers.device.fraction": (
        "float in (0, 1) or null",
        "Of the worker memory limit (GPU memory on GPU workers).",
    ),
    "table.tiers.host": ("mapping", "Host-memory tier per worker."),
    "table.tiers.host.fraction": ("float in [0, 1)", "Of the worker memory limit; 0: none."),
    "table.tiers.policy": ("`lru` or `lfu`", "Eviction policy of device and host tiers."),
    "table.tiers.store_dir": ("path", "Zarr stores (local disk).", "`<run.dir>/stores`"),
    "table.tiers.snapshot_every": ("int >= 1", "Full index snapshot every N commits."),
    "table.expected_keys": (
        "int >= 1 or null",
        "Distinct keys expected; sizes the run (`daskhps plan`, `train`'s early check).",
    ),
    "model.name": ("str", "`dlrm`, `deepfm`, `wide_deep` or `package.module:Class`."),
    "model.options": ("mapping", "The model's constructor options (docs/models.md)."),
    "dense_optimizer.kind": ("`sgd`, `adam` or `adagrad`", "Optimizer of the dense model."),
    "dense_optimizer.lr": ("float > 0", "Peak learning rate."),
    "dense_optimizer.weight_decay": ("float >= 0", "Weight decay."),
    "dense_optimizer.schedule": (
        "`constant`, `warmup_constant` or `cosine`",
        "Learning rate over the steps of the run.",
    ),
    "dense_optimizer.warmup_steps": ("int >= 0", "Linear warmup steps (not with `constant`)."),
    "dense_optimizer.grad_clip_norm": ("float > 0 or null", "Clip the global gradient norm."),
    "cluster.address": ("str or null", "Existing scheduler; null: start a LocalCluster."),
    "cluster.n_workers": ("int >= 1", "Local workers."),
    "cluster.threads_per_worker": ("int >= 1", "Threads per local worker."),
    "cluster.memory_limit": ("bytes, size or `auto`", "Per local worker (`4GiB`, `auto`)."),
    "cluster.processes": ("bool", "Local workers as processes (else threads)."),
    "cluster.dashboard_address": ("host:port", "Dask dashboard of the LocalCluster."),
    "cluster.gpu": ("`false`, `true` or `auto`", "GPU workers (LocalCUDACluster locally)."),
    "cluster.dist_backend": ("`auto`, `gloo` or `nccl`", "torch.distributed backend."),
    "cluster.dist_timeout_s": ("float > 0", "Timeout of collectives: a lost worker fails."),
    "eval.every_pass": ("bool", "Evaluate after every pass (always at the end)."),
    "eval.batch_size": (
        "int >= 1",
        "Rows per evaluation batch on each worker. A batch's activations are held at once "
        "(about 8 KiB a row for the quickstart's DLRM; `daskhps plan` measures the configured "
        "model); predictions do not depend on it.",
    ),
    "eval.metrics": ("list", "Of `auc`, `logloss`, `ne`, `calibration`."),
    "checkpoint.every_passes": (
        "int >= 0",
        "Checkpoint every N passes and after the last; 0: never.",
    ),
    "checkpoint.keep": ("int >= 1", "Keep the newest N checkpoints (older ones are deleted)."),
    "checkpoint.full_every": (
        "int >= 1",
        "Every Nth checkpoint is a full base; others are deltas.",
    ),
    "retrain.max_auc_drop": (
        "float in [0, 1] or null",
        "`daskhps retrain` publishes only if AUC drops at most this much; null: no check.",
    ),
    "retrain.max_logloss_rise": (
        "float >= 0 or null",
        "... and logloss rises at most this much (null: no check).",
    ),
    "retrain.min_auc": (
        "float in [0, 1] or null",
        "... and AUC is at least this (null: no check).",
    ),
}
_SECTION_TEXT = {
    "run": "The run: its name, directory and seed.",
    "data": "Training logs, schema, bad rows, holdout.",
    "passes": "How the training rows are cut into passes and global batches.",
    "table": "The embedding table, its sparse optimizer and its tiers.",
    "model": "The dense model (`daskhps.models`).",
    "dense_optimizer": "The dense model's optimizer and learning-rate schedule.",
    "cluster": "The Dask cluster: embedded (default) or an existing scheduler.",
    "eval": "Evaluation on `data.holdout`.",
    "checkpoint": "Checkpoints of the run (docs/checkpoints.md).",
    "retrain": "The publish guard of `daskhps retrain` (docs/retraining.md).",
}
# Sample configs whose resolved values are the defaults (each holds the alternative the
# other leaves out: train files vs generated logs, a holdout).
_SAMPLES: tuple[dict[str, Any], ...] = (
    {"data": {"generate": {}}},
    {"data": {"train": {"paths": "logs"}, "holdout": {"fraction": 0.1}}},
)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        path = f"{prefix}.{k}" if prefix else k
        out[path] = v
        if isinstance(v, dict):
            out.update(_flatten(v, path))
    return out


def defaults() -> dict[str, Any]:
    """``{dotted key: value}`` of the minimal configs, resolved by the loader."""
    from daskhps.config.runconfig import RunConfig

    out: dict[str, Any] = {}
    for sample in _SAMPLES:
        for k, v in _flatten(RunConfig.from_dict(sample).to_dict()).items():
            out.setdefault(k, v)
    return out


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "`{}`" if not value else "—"  # a section: its keys follow
    return f"`{json.dumps(value)}`".replace('"', "")


def _leaves(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and prefix:
            out.append(path)  # a sub-mapping gets its own row, then its keys
        if isinstance(v, dict):
            out.extend(_leaves(v, path))
        elif prefix:
            out.append(path)
    return out


def render() -> str:
    """The reference tables, one per section, as Markdown."""
    vals = defaults()
    tree = key_tree()
    lines: list[str] = []
    for section in tree:
        lines += [f"### `{section}`", "", _SECTION_TEXT[section], ""]
        lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for key in _leaves({section: tree[section]}):
            if key == section:
                continue
            typ, meaning, *explicit = DOCS[key]
            if explicit:
                default = explicit[0]
            elif key in vals:
                default = _show(vals[key])
            else:
                default = "null"
            lines.append(f"| `{key}` | {typ} | {default} | {meaning} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


START, END = "<!-- reference:start -->", "<!-- reference:end -->"


def update_document(path: str | Path) -> bool:
    """Rewrite the reference between the markers of ``path``; True when it changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    new = f"{head}{START}\n\n{render()}\n{END}{tail}"
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    changed = update_document(sys.argv[1] if len(sys.argv) > 1 else "docs/configuration.md")
    print("updated" if changed else "up to date")

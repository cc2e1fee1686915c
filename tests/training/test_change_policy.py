"""Which config keys a resume and a warm start accept changing, pinned key by key.

Every leaf key of fully resolved configs (generated and read logs, a holdout, model options)
is changed alone, and each mode's answer is compared with the table below: a change to what
either mode accepts must be made here on purpose, never by accident.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from daskhps.config import RunConfig, load_config
from daskhps.errors import ConfigError, ResumeError
from daskhps.retrain.candidate import check_warm_start
from daskhps.training import changes
from daskhps.training.resume import check_resume
from tests._runs import config_checkpoint

_CONFIGS = (
    {
        "run": {"dir": "runs/r"},
        "data": {"train": {"paths": "logs"}, "holdout": {"day": "2024-01-04"}},
        "table": {"dim": 8},
        "model": {"name": "dlrm", "options": {"bottom_mlp": [4]}},
    },
    {"run": {"dir": "runs/r"}, "data": {"generate": {"out": "logs"}}, "table": {"dim": 8}},
    {
        "run": {"dir": "runs/r"},
        "data": {"generate": {"out": "logs"}},
        "tables": [{"name": "ids", "dim": 4, "features": ["C1", "C2"]}],
    },
)

# key: (a resume accepts changing it, a warm start accepts changing it)
POLICY: dict[str, tuple[bool, bool]] = {
    "checkpoint.every_passes": (True, True),
    "checkpoint.full_every": (True, True),
    "checkpoint.keep": (True, True),
    "checkpoint.replicate_to": (True, True),
    "cluster.address": (True, True),
    "cluster.dashboard_address": (True, True),
    "cluster.dist_backend": (True, True),
    "cluster.dist_timeout_s": (True, True),
    "cluster.gpu": (True, True),
    "cluster.max_restarts": (True, True),
    "cluster.restart_wait_s": (True, True),
    "cluster.security": (True, True),
    "cluster.memory_limit": (True, True),
    "cluster.n_workers": (True, True),
    "cluster.processes": (True, True),
    "cluster.threads_per_worker": (True, True),
    "data.backend": (False, True),
    "data.block_size": (False, True),
    "data.bad_rows.action": (False, True),
    "data.bad_rows.max_fraction": (False, True),
    "data.generate": (False, True),
    "data.generate.ctr": (False, True),
    "data.generate.days": (False, True),
    "data.generate.drift": (False, True),
    "data.generate.exponent": (False, True),
    "data.generate.gzip": (False, True),
    "data.generate.one_off": (False, True),
    "data.generate.out": (False, True),
    "data.generate.parts_per_day": (False, True),
    "data.generate.rows_per_day": (False, True),
    "data.generate.seed": (False, True),
    "data.generate.signal": (False, True),
    "data.generate.start_day": (False, True),
    "data.generate.vocab_scale": (False, True),
    "data.generate.workers": (True, True),
    "data.holdout": (False, True),
    "data.holdout.day": (False, True),
    "data.holdout.fraction": (False, True),
    "data.holdout.progressive": (False, True),
    "data.holdout.seed": (False, True),
    "data.schema": (False, False),
    "data.train": (False, True),
    "data.train.days": (False, True),
    "data.train.paths": (False, True),
    "data.train.require_complete": (False, True),
    "dense_optimizer.grad_clip_norm": (True, True),
    "dense_optimizer.kind": (False, False),
    "dense_optimizer.lr": (True, True),
    "dense_optimizer.schedule": (False, True),
    "dense_optimizer.warmup_steps": (False, True),
    "dense_optimizer.weight_decay": (True, True),
    "eval.batch_size": (True, True),
    "eval.every_pass": (True, True),
    "eval.metrics": (True, True),
    "eval.best_by": (True, True),
    "eval.patience": (True, True),
    "eval.min_delta": (True, True),
    "eval.diverge_factor": (True, True),
    "model.name": (False, False),
    "model.options.bottom_mlp": (False, False),
    "passes.epochs": (True, True),
    "passes.examples_per_pass": (False, True),
    "passes.global_batch_size": (False, True),
    "passes.max_working_set": (False, True),
    "passes.num_shards": (False, False),
    "passes.shuffle_examples": (False, True),
    "passes.shuffle_method": (True, True),
    "retrain.max_auc_drop": (False, True),
    "retrain.max_logloss_rise": (False, True),
    "retrain.min_auc": (False, True),
    "retrain.keep_versions": (False, True),
    "retrain.poll_seconds": (False, True),
    "run.dir": (True, True),
    "run.name": (True, True),
    "run.quiet": (True, True),
    "run.seed": (False, True),
    "table.admission.min_count": (False, True),
    "table.admission.probability": (False, True),
    "table.dim": (False, False),
    "table.expiry.max_rows": (False, True),
    "table.expiry.score": (False, True),
    "table.expiry.ttl_days": (False, True),
    "table.expected_keys": (False, True),
    "table.init_scale": (False, False),
    "table.name": (False, False),
    "table.optimizer.beta1": (False, True),
    "table.optimizer.beta2": (False, True),
    "table.optimizer.eps": (False, True),
    "table.optimizer.initial_accumulator": (False, True),
    "table.optimizer.kind": (False, False),
    "table.optimizer.lr": (True, True),
    "table.optimizer.row_wise": (False, False),
    "table.seed": (False, False),
    "table.tiers.device.fraction": (True, True),
    "table.tiers.device.rows": (True, True),
    "table.tiers.host.fraction": (True, True),
    "table.tiers.policy": (True, True),
    "table.tiers.snapshot_every": (True, True),
    "table.tiers.store_dir": (True, True),
    "tables[0].admission.min_count": (False, True),
    "tables[0].admission.probability": (False, True),
    "tables[0].dim": (False, False),
    "tables[0].expiry.max_rows": (False, True),
    "tables[0].expiry.score": (False, True),
    "tables[0].expiry.ttl_days": (False, True),
    "tables[0].features": (False, False),
    "tables[0].init_scale": (False, False),
    "tables[0].name": (False, False),
    "tables[0].optimizer.beta1": (False, True),
    "tables[0].optimizer.beta2": (False, True),
    "tables[0].optimizer.eps": (False, True),
    "tables[0].optimizer.initial_accumulator": (False, True),
    "tables[0].optimizer.kind": (False, False),
    "tables[0].optimizer.lr": (True, True),
    "tables[0].optimizer.row_wise": (False, False),
    "tables[0].seed": (False, False),
    "tables[0].shared_keys": (False, False),
    "tables[0].tiers": (True, True),
}


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, list) and d and all(isinstance(v, dict) for v in d):  # the tables
        for i, v in enumerate(d):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out
    if not isinstance(d, dict):
        return {prefix: d}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _other(v: Any) -> Any:
    """A value unlike ``v`` (valid or not: the checks compare, they do not validate)."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int | float):
        return v * 2 + 1
    if isinstance(v, str):
        return v + "-changed"
    if isinstance(v, list):
        return [*v, "changed"]
    return 7  # None


@dataclasses.dataclass(frozen=True)
class _Edited(RunConfig):
    """A config whose ``to_dict`` differs from its base in one leaf (what both checks read);
    the edited value need not pass validation."""

    edited: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return self.edited


def _edit(cfg: RunConfig, key: str, value: Any) -> RunConfig:
    d = cfg.to_dict()
    node: Any = d
    *path, last = re.sub(r"\[(\d+)\]", r".\1", key).split(".")  # tables[0].dim: tables.0.dim
    for p in path:
        node = node[int(p)] if isinstance(node, list) else node[p]
    node[last] = value
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(RunConfig)}
    return _Edited(**fields, edited=d)


def _cases() -> list[tuple[int, str]]:
    seen: set[str] = set()
    cases = []
    for i, d in enumerate(_CONFIGS):
        for key in _flatten(RunConfig.from_dict(d).to_dict()):
            if key not in seen:
                seen.add(key)
                cases.append((i, key))
    return cases


def test_the_table_names_every_key_of_the_configs() -> None:
    """A key added to the config must be pinned here (and classified by the policy)."""
    assert sorted(k for _, k in _cases()) == sorted(POLICY)


@pytest.mark.parametrize(("config", "key"), _cases())
def test_each_mode_accepts_what_the_table_says(tmp_path: Path, config: int, key: str) -> None:
    old = RunConfig.from_dict(_CONFIGS[config])
    value = _flatten(old.to_dict())[key]
    new = _edit(old, key, _other(value))
    ckpt = config_checkpoint(tmp_path / "pass-000001", old.to_dict())
    resume_ok, warm_ok = POLICY[key]
    try:
        assert check_resume(ckpt, new) == {key: (value, _other(value))}
        resumed = True
    except ResumeError as e:
        assert key in str(e) and "start a new run" in str(e)
        resumed = False
    try:
        check_warm_start(ckpt, new)
        warm = True
    except ConfigError as e:
        assert key in str(e) and "put the published values back" in str(e)
        warm = False
    assert (resumed, warm) == (resume_ok, warm_ok)


def test_every_key_is_classified_once() -> None:
    """The policy decides every key of the configs; a new key needs an entry of its own or a
    node above it chosen on purpose (a key no entry covers is refused by both modes)."""
    assert [k for _, k in _cases() if changes.rule(k) is None] == []
    names = [r.key for r in changes.POLICY]
    assert len(names) == len(set(names))
    assert all(r.why for r in changes.POLICY)


def test_an_unclassified_key_is_refused_by_both_modes(tmp_path: Path) -> None:
    old = RunConfig.from_dict(_CONFIGS[1])
    d = old.to_dict()
    d["table"]["new_knob"] = 1
    fields = {f.name: getattr(old, f.name) for f in dataclasses.fields(RunConfig)}
    new = _Edited(**fields, edited=d)
    assert changes.rule("table.new_knob") is None
    with pytest.raises(ResumeError, match=r"table\.new_knob: None -> 1"):
        changes.check_changes(old, new, "resume", tmp_path)
    with pytest.raises(ConfigError, match=r"table\.new_knob: None -> 1"):
        changes.check_changes(old, new, "warm_start", tmp_path)


def test_the_documented_table_is_the_policy() -> None:
    """docs/checkpoints.md shows the table both docs point at; it must be the code's."""
    doc = (Path(__file__).parents[2] / "docs" / "checkpoints.md").read_text()
    doc = doc.split("## What may change when a run continues", 1)[1].split("\n## ", 1)[0]
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in doc.splitlines()
        if line.startswith("| `")
    ]
    shown = {r[0].strip("`"): (r[1] == "yes", r[2] == "yes", r[3]) for r in rows if len(r) == 4}
    policy = {r.key: (r.resume, r.warm_start, r.why) for r in changes.POLICY}
    assert shown == policy


def _tables(**first: Any) -> dict[str, Any]:
    ids = {"name": "ids", "dim": 4, "features": ["C1", "C2"], **first}
    return {**_CONFIGS[1], "tables": [ids, {"name": "small", "dim": 2, "features": ["C3"]}]}


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"dim": 8}, "tables[0].dim"),
        ({"features": ["C1", "C4"]}, "tables[0].features"),
        ({"shared_keys": True}, "tables[0].shared_keys"),
    ],
)
def test_a_resume_may_not_change_what_a_tables_rows_mean(
    tmp_path: Path, change: dict[str, Any], key: str
) -> None:
    old, new = RunConfig.from_dict(_tables()), RunConfig.from_dict(_tables(**change))
    ckpt = config_checkpoint(tmp_path / "pass-000001", old.to_dict())
    with pytest.raises(ResumeError) as e:
        check_resume(ckpt, new)
    msg = str(e.value)
    assert "\n" not in msg and f"{key}: " in msg
    assert [k for k in changes.config_changes(old, new)] == [key]


def test_a_table_added_or_removed_is_refused_and_one_table_is_as_before(tmp_path: Path) -> None:
    old = RunConfig.from_dict(_CONFIGS[1])
    assert "tables" not in old.to_dict()  # config.yaml of one table is what it always was
    new = RunConfig.from_dict(_tables())
    ckpt = config_checkpoint(tmp_path / "pass-000001", old.to_dict())
    with pytest.raises(ResumeError, match=r"tables\[0\]\.name: None -> 'ids'"):
        check_resume(ckpt, new)
    with pytest.raises(ConfigError, match=r"tables\[1\]\.features: None -> \['C3'\]"):
        check_warm_start(ckpt, new)
    # the learning rate of a listed table may be tuned on resume
    tuned = RunConfig.from_dict(_tables(optimizer={"lr": 0.5}))
    ckpt = config_checkpoint(tmp_path / "pass-000002", new.to_dict())
    assert check_resume(ckpt, tuned) == {"tables[0].optimizer.lr": (0.05, 0.5)}


_FILE = """\
run: {dir: runs/r}
data:
  generate: {out: logs}
table:
  dim: 8
tables:
  - name: ids
    dim: 4
    features: [C1, C2]
  - name: small
    features: [C3]
"""


@pytest.mark.parametrize(
    ("edit", "overrides", "said"),
    [
        # the line that writes the new value
        (("dim: 4", "dim: 16"), (), "tables[0].dim: 4 -> 16 at {run}:8"),
        # an entry's dim left out is table.dim's: that line
        (("dim: 8", "dim: 16"), (), "tables[1].dim: 8 -> 16 at {run}:5 (from table.dim)"),
        # a value inside --set tables, though the file writes tables[0].dim too
        ((), ("tables=[{name: ids, dim: 6, features: [C1, C2]}, {name: small, features: [C3]}]",),
         "tables[0].dim: 4 -> 6 at {run} (--set tables)"),
        # a table the file no longer has
        (("  - name: small\n    features: [C3]\n", ""), (),
         "tables[1].name: 'small' -> None, not in {run}"),
        (("run: {", "run: {seed: 3, "), (), "tables[0].seed: 0 -> 3 at {run}:1 (from run.seed)"),
    ],
)  # fmt: skip
def test_a_refused_change_names_where_the_new_value_is_written(
    tmp_path: Path, edit: tuple[str, ...], overrides: tuple[str, ...], said: str
) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(_FILE)
    ckpt = config_checkpoint(tmp_path / "pass-000001", load_config(run).to_dict())
    run.write_text(_FILE.replace(*edit) if edit else _FILE)
    with pytest.raises(ResumeError) as e:
        check_resume(ckpt, load_config(run, overrides))
    assert said.format(run=run) in str(e.value), e.value


def test_resumed_with_the_runs_config_yaml_it_is_the_file_named(tmp_path: Path) -> None:
    old = RunConfig.from_dict(_tables())
    ckpt = config_checkpoint(tmp_path / "pass-000001", old.to_dict())
    written = tmp_path / "config.yaml"  # what the run wrote, every entry in full, edited
    text = old.to_yaml()
    written.write_text(text.replace("dim: 4", "dim: 16", 1))
    line = text.splitlines().index("  dim: 4") + 1
    with pytest.raises(ResumeError, match=re.escape(f"tables[0].dim: 4 -> 16 at {written}:{line}")):
        check_resume(ckpt, load_config(written))
    with pytest.raises(ResumeError, match=re.escape(f"table.dim: 8 -> 2 at {written} (--set")):
        check_resume(ckpt, load_config(written, ["table.dim=2"]))

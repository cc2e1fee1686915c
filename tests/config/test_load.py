"""Loading run configs: every shipped config, defaults, derived values, YAML details."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from daskhps._yaml import load_yaml_with_lines
from daskhps.config import RunConfig, load_config
from daskhps.data.schema import criteo_schema
from tests.config.helpers import MINIMAL, load, write

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


def test_configs_exist() -> None:
    names = {p.name for p in CONFIGS}
    assert {"quickstart.yaml", "criteo.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_loads_and_round_trips(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.source == str(path)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_quickstart() -> None:
    cfg = load_config(next(p for p in CONFIGS if p.name == "quickstart.yaml"))
    assert cfg.run.name == "quickstart" and cfg.run.dir == "runs/quickstart"
    gen = cfg.data.generate
    assert gen is not None and gen.generator.days == 2
    assert cfg.data.holdout is not None and cfg.data.holdout.day == "last"
    assert cfg.model.name == "dlrm" and cfg.cluster.local and cfg.cluster.n_workers == 2
    assert cfg.cluster.backend_for(has_gpu=False) == "gloo"
    src = cfg.data.source
    assert src.paths == (gen.out,) and src.require_complete and src.days == gen.day_range


def test_minimal_defaults(tmp_path: Path) -> None:
    cfg = load(tmp_path, MINIMAL)
    assert cfg.run.name == "run" and cfg.run.dir == "runs/run" and cfg.run.seed == 0
    assert cfg.table.tiers.store_dir == "runs/run/stores"
    assert cfg.data.generate is not None and cfg.data.generate.out == "runs/run/data"
    assert cfg.data.schema == criteo_schema() and cfg.data.holdout is None
    assert cfg.table.dim == 16 and cfg.table.optimizer.kind == "adagrad"
    assert cfg.table.tiers.device.fraction == 0.25 and cfg.table.tiers.device.rows is None
    assert cfg.model.name == "dlrm" and cfg.sparse_dim == 16
    assert cfg.cluster.dashboard_address == "127.0.0.1:8787"
    assert cfg.cluster.dist_timeout_s == 60.0 and cfg.cluster.memory_limit is None
    assert cfg.eval.metrics == ("auc", "logloss", "ne", "calibration")
    assert cfg.passes.epochs == 1 and cfg.passes.plan.global_batch_size == 4096


def test_seeds_follow_run_seed(tmp_path: Path) -> None:
    cfg = load(tmp_path, MINIMAL + "run: {seed: 7}\n")
    assert cfg.table.seed == 7
    cfg = load(tmp_path, "run: {seed: 7}\ndata: {train: {paths: x}, holdout: {fraction: 0.1}}\n")
    assert cfg.data.holdout is not None and cfg.data.holdout.seed == 7
    cfg = load(tmp_path, MINIMAL + "run: {seed: 7}\ntable: {seed: 3}\n")
    assert cfg.table.seed == 3


def test_dir_and_store_dir(tmp_path: Path) -> None:
    cfg = load(tmp_path, MINIMAL + "run: {name: a, dir: /data/runs/x}\n")
    assert cfg.run.dir == "/data/runs/x" and cfg.table.tiers.store_dir == "/data/runs/x/stores"


def test_sparse_dim_from_model(tmp_path: Path) -> None:
    cfg = load(tmp_path, MINIMAL + "model: {name: deepfm}\ntable: {dim: 8}\n")
    assert cfg.sparse_dim == 9
    spec = cfg.table_spec()
    assert spec.dim == 9 and spec.stats_at == 18  # adagrad: one accumulator per element


def test_yaml_dates_and_exponent_floats(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        data:
          generate: {start_day: 2024-03-01, days: 2}
          holdout: {day: 2024-03-02}
        dense_optimizer: {lr: 1e-3}
        passes: {examples_per_pass: 1e6}
        """,
    )
    assert cfg.data.generate is not None and cfg.data.generate.generator.start_day == "2024-03-01"
    assert cfg.data.holdout is not None and cfg.data.holdout.day == "2024-03-02"
    assert cfg.dense_optimizer.lr == 1e-3 and cfg.passes.plan.examples_per_pass == 1_000_000


def test_memory_limit_sizes(tmp_path: Path) -> None:
    for text, expected in (("4GiB", 4 << 30), ("500MB", 500_000_000), (1 << 30, 1 << 30)):
        cfg = load(tmp_path, MINIMAL + f"cluster: {{memory_limit: {text}}}\n")
        assert cfg.cluster.memory_limit == expected
    assert load(tmp_path, MINIMAL + "cluster: {memory_limit: auto}\n").cluster.memory_limit is None


def test_address_cluster(tmp_path: Path) -> None:
    cfg = load(tmp_path, MINIMAL + "cluster: {address: 'tcp://h:8786', gpu: true}\n")
    assert not cfg.cluster.local and cfg.cluster.backend_for(has_gpu=True) == "nccl"
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert "n_workers" not in cfg.to_dict()["cluster"]


def test_schema_file_beside_config(tmp_path: Path) -> None:
    write(tmp_path, "name: s\nformat: csv\nheader: true\nlabel: y\ncategorical: [a]\n", "s.yaml")
    cfg = load(tmp_path, "data: {train: {paths: logs}, schema: s.yaml}\n")
    assert cfg.data.schema.name == "s" and cfg.data.source.schema.name == "s"
    again = RunConfig.from_dict(cfg.to_dict())  # an inline schema after the round trip
    assert again == cfg


def test_builtin_schema_name_is_not_shadowed_by_a_folder(tmp_path: Path) -> None:
    # A `criteo/` folder of logs beside the config is common; the name stays the builtin.
    (tmp_path / "criteo" / "day=2024-01-01").mkdir(parents=True)
    cfg = load(tmp_path, "data: {train: {paths: criteo}, schema: criteo}\n")
    assert cfg.data.schema == criteo_schema()


def test_schema_value_that_looks_like_a_file_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "schemas").mkdir()
    write(tmp_path / "schemas", "name: mine\nformat: csv\nheader: true\nlabel: y\n"
          "categorical: [a]\n", "criteo")  # fmt: skip
    cfg = load(tmp_path, "data: {train: {paths: logs}, schema: schemas/criteo}\n")
    assert cfg.data.schema.name == "mine"
    write(tmp_path, "name: yml\nformat: csv\nheader: true\nlabel: y\ncategorical: [a]\n",
          "criteo.yml")  # fmt: skip
    cfg = load(tmp_path, "data: {train: {paths: logs}, schema: criteo.yml}\n")
    assert cfg.data.schema.name == "yml"


def test_train_source_carries_schema_and_policy(tmp_path: Path) -> None:
    cfg = load(tmp_path, "data: {train: {paths: [a, b], days: [2024-01-01, 2024-01-03]}, "
                         "bad_rows: fail}\n")  # fmt: skip
    src = cfg.data.source
    assert src.paths == ("a", "b") and src.days == ("2024-01-01", "2024-01-03")
    assert src.bad_rows.fail and cfg.data.bad_rows.fail


def test_to_yaml_reloads(tmp_path: Path) -> None:
    cfg = load(tmp_path, MINIMAL + "model: {name: wide_deep, options: {deep_mlp: [8, 4]}}\n")
    again = load_config(write(tmp_path, cfg.to_yaml(), "again.yaml"))
    assert again == cfg


def test_line_map(tmp_path: Path) -> None:
    _, lines = load_yaml_with_lines(write(tmp_path, "a:\n  b: 1\n  c:\n    - x\n    - y\n"))
    assert lines == {"a": 1, "a.b": 2, "a.c": 3, "a.c[0]": 4, "a.c[1]": 5}


def test_empty_file_needs_data(tmp_path: Path) -> None:
    from daskhps.errors import ConfigError

    with pytest.raises(ConfigError, match="data: give exactly one of train"):
        load(tmp_path, "")

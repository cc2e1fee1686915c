"""``--set key=value`` overrides: parsed as YAML, applied before validation, checked keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from daskhps.config import RunConfig, apply_overrides, parse_override
from daskhps.errors import ConfigError
from tests.config.helpers import MINIMAL, error, load, located


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        ("table.dim=32", "table.dim", 32),
        ("dense_optimizer.lr=1e-4", "dense_optimizer.lr", 1e-4),
        ("data.train.paths=[a, b]", "data.train.paths", ["a", "b"]),
        ("cluster.gpu=auto", "cluster.gpu", "auto"),
        ("run.quiet=true", "run.quiet", True),
        ("data.holdout=null", "data.holdout", None),
        ("run.name= spaced ", "run.name", "spaced"),
        ("cluster.address=tcp://h:8786", "cluster.address", "tcp://h:8786"),
        ("data.holdout.day=2024-01-02", "data.holdout.day", "2024-01-02"),
    ],
)
def test_parse(text: str, key: str, value: object) -> None:
    assert parse_override(text) == (key, value)


def test_applied_before_validation(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        MINIMAL,
        "table.dim=32",
        "data.generate.days=3",
        "data.holdout={day: last}",
        "model.options.top_mlp=[8]",
        "cluster.memory_limit=2GiB",
    )
    assert cfg.table.dim == 32 and cfg.cluster.memory_limit == 2 << 30
    assert cfg.data.generate is not None and cfg.data.generate.generator.days == 3
    assert cfg.data.holdout is not None and cfg.data.holdout.day == "last"
    assert cfg.model.options["top_mlp"] == (8,)


def test_later_override_wins_and_input_is_not_changed() -> None:
    d: dict[str, Any] = {"data": {"generate": {}}, "table": {"dim": 4}}
    out, keys = apply_overrides(d, ["table.dim=8", "table.dim=12"])
    assert out["table"]["dim"] == 12 and d["table"]["dim"] == 4 and keys == {"table.dim"}


def test_from_dict_takes_overrides() -> None:
    cfg = RunConfig.from_dict({"data": {"generate": {}}}, overrides=["run.seed=5"])
    assert cfg.run.seed == 5 and cfg.table.seed == 5


def test_unknown_key_names_closest(tmp_path: Path) -> None:
    msg = error(tmp_path, MINIMAL, "table.tiers.hots.fraction=0.1")
    assert msg.endswith("did you mean table.tiers.host.fraction?"), msg
    assert "(--set table.tiers.hots.fraction)" in msg
    msg = error(tmp_path, MINIMAL, "dim=8")
    assert "did you mean table.dim?" in msg


def test_bad_value_names_the_override(tmp_path: Path) -> None:
    msg = error(tmp_path, MINIMAL, "table.dim=big")
    assert located(msg, Path(f"{tmp_path / 'run.yaml'} (--set table.dim)"), "table.dim"), msg
    assert "expected int, got str 'big'" in msg


def test_malformed_and_non_mapping_parent(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_override("table.dim")
    msg = error(tmp_path, MINIMAL + "data: {train: {paths: x}, schema: criteo}\n",
                "data.schema.label=y")  # fmt: skip
    assert "data.schema is 'criteo', not a mapping" in msg


def test_set_cluster_address_sets_the_files_local_settings_aside(tmp_path: Path) -> None:
    text = MINIMAL + "cluster:\n  n_workers: 3\n  memory_limit: 2GiB\n  gpu: false\n"
    cfg = load(tmp_path, text, "cluster.address=tcp://127.0.0.1:8786")
    assert cfg.cluster.address == "tcp://127.0.0.1:8786" and cfg.cluster.gpu is False
    assert "n_workers" not in cfg.to_dict()["cluster"]
    # written beside the address, in the file or with --set too, they are still refused
    msg = error(tmp_path, text + "  address: tcp://127.0.0.1:8786\n")
    assert located(msg, tmp_path / "run.yaml", "cluster.n_workers", 4)
    msg = error(tmp_path, text, "cluster.address=tcp://h:1", "cluster.n_workers=2")
    assert "(--set cluster.n_workers)" in msg and "local settings" in msg

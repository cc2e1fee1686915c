"""Helpers of the sections: generated-log reuse, learning-rate schedules, tier sizes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from daskhps.config import DenseOptimizerConfig, DeviceTierConfig, HostTierConfig, TiersConfig
from daskhps.errors import ConfigError
from daskhps.table import TableSpec
from daskhps.tier_sizing import MEMORY_BUDGET, TierSizing, row_cost
from daskhps.tiers.host import rows_for_bytes
from tests.config.helpers import MINIMAL, load


def test_generate_then_reuse(tmp_path: Path) -> None:
    out = tmp_path / "logs"
    cfg = load(tmp_path, f"data:\n  generate: {{out: {out}, days: 2, rows_per_day: 50}}\n")
    gen = cfg.data.generate
    assert gen is not None and not gen.ready()
    assert gen.ensure(scheduler="sync") is True
    assert gen.ready() and gen.ensure(scheduler="sync") is False  # reused
    assert sorted(p.name for p in out.glob("day=*")) == ["day=2024-01-01", "day=2024-01-02"]
    (out / "day=2024-01-02" / "_SUCCESS").unlink()  # an interrupted generation
    assert not gen.ready() and gen.ensure(scheduler="sync") is True
    other = load(tmp_path, f"data:\n  generate: {{out: {out}, days: 2, rows_per_day: 60}}\n")
    assert other.data.generate is not None
    with pytest.raises(ConfigError, match=r"rows_per_day=50.*delete the folder"):
        other.data.generate.ready()


def test_more_generated_days_extend_the_same_logs(tmp_path: Path) -> None:
    # daskhps retrain gets a new day by raising data.generate.days
    out = tmp_path / "logs"
    text = "data:\n  generate: {{out: {out}, days: {days}, rows_per_day: 50}}\n"
    two = load(tmp_path, text.format(out=out, days=2)).data.generate
    assert two is not None and two.ensure(scheduler="sync") is True
    first = {p.relative_to(out): p.read_bytes() for p in out.glob("day=*/part-*")}
    three = load(tmp_path, text.format(out=out, days=3)).data.generate
    assert three is not None and not three.ready()
    assert three.ensure(scheduler="sync") is True and three.ready()
    assert sorted(p.name for p in out.glob("day=*")) == [f"day=2024-01-0{d}" for d in (1, 2, 3)]
    assert all(
        p.read_bytes() == first[p.relative_to(out)] for p in out.glob("day=2024-01-0[12]/part-*")
    )  # the earlier days as they were
    assert two.ready()  # fewer days: those days are there, complete


def test_logs_generated_before_a_setting_existed_are_the_same_logs(tmp_path: Path) -> None:
    # generation.json from before drift and one_off: they were 0 then, their defaults
    out = tmp_path / "logs"
    cfg = load(tmp_path, f"data:\n  generate: {{out: {out}, rows_per_day: 50}}\n").data.generate
    assert cfg is not None and cfg.ensure(scheduler="sync") is True
    meta = json.loads((out / "generation.json").read_text())
    del meta["config"]["drift"], meta["config"]["one_off"]
    (out / "generation.json").write_text(json.dumps(meta))
    assert cfg.ready()
    drifting = load(tmp_path, f"data:\n  generate: {{out: {out}, rows_per_day: 50, drift: 0.1}}\n")
    assert drifting.data.generate is not None
    with pytest.raises(ConfigError, match=r"drift=0\.0.*delete the folder"):
        drifting.data.generate.ready()


def test_generation_json_unreadable_means_regenerate(tmp_path: Path) -> None:
    cfg = load(tmp_path, f"data:\n  generate: {{out: {tmp_path}, rows_per_day: 10}}\n")
    (tmp_path / "generation.json").write_text(json.dumps({"nope": 1}))
    assert cfg.data.generate is not None and not cfg.data.generate.ready()


@pytest.mark.parametrize(
    ("schedule", "warmup", "expected"),
    [
        ("constant", 0, [1.0, 1.0, 1.0, 1.0, 1.0]),
        ("warmup_constant", 2, [0.5, 1.0, 1.0, 1.0, 1.0]),
        (
            "cosine",
            1,
            [
                1.0,
                1.0,
                0.5 * (1 + math.cos(math.pi / 4)),
                0.5,
                0.5 * (1 + math.cos(3 * math.pi / 4)),
            ],
        ),
    ],
)
def test_lr_factor(schedule: str, warmup: int, expected: list[float]) -> None:
    opt = DenseOptimizerConfig(schedule=schedule, warmup_steps=warmup)
    got = [opt.lr_factor(s, total_steps=5) for s in range(5)]
    assert got == pytest.approx(expected)
    assert opt.lr_factor(10, total_steps=5) >= 0.0


def test_tier_sizes_are_the_workers_sizing(tmp_path: Path) -> None:
    # table.tiers becomes the TierSizing the workers, plan and the config check all use.
    spec = TableSpec("t", dim=16)
    by_rows = TiersConfig(device=DeviceTierConfig(rows=100), host=HostTierConfig(fraction=0.5))
    assert by_rows.sizing == TierSizing(device_rows=100, host_fraction=0.5)
    rows, host = by_rows.sizing.resolve([spec], 1 << 30)["t"]
    assert rows == 100 and host == pytest.approx(1 << 29, abs=1)
    by_fraction = TiersConfig(
        device=DeviceTierConfig(fraction=0.25), host=HostTierConfig(fraction=0)
    )
    assert by_fraction.sizing == TierSizing(device_fraction=0.25)  # host 0: no host tier
    rows, host = by_fraction.sizing.resolve([spec], 1 << 20)["t"]
    assert rows == rows_for_bytes(spec.width, 1 << 18) and host == 0
    # The config refuses what the workers would: rows priced as the tiers allocate them.
    limit = 1 << 30
    too_many = int(MEMORY_BUDGET * limit / row_cost(spec.width, "lru")) + 1
    text = MINIMAL + f"cluster: {{memory_limit: {limit}}}\ntable:\n  dim: 16\n"
    fits = f"table.tiers.device.rows={too_many - 1}"
    assert load(tmp_path, text, fits, "table.tiers.host.fraction=0").table.tiers.device.rows
    with pytest.raises(ConfigError, match=r"device\.rows .* 0\.60 of the worker memory limit"):
        load(tmp_path, text, f"table.tiers.device.rows={too_many}", "table.tiers.host.fraction=0")
    with pytest.raises(ConfigError, match=r"tier sizing: device\.rows"):
        TierSizing(device_rows=too_many).resolve([spec], limit)


def test_host_tier_counts_against_the_budget_on_gpu_workers(tmp_path: Path) -> None:
    text = MINIMAL + "cluster: {gpu: true}\ntable:\n  tiers:\n    device: {fraction: 0.5}\n"
    assert load(tmp_path, text).cluster.gpu is True  # the device tier is in GPU memory
    with pytest.raises(ConfigError, match=r"host\.fraction 0\.7 = 0\.70"):
        load(tmp_path, text, "table.tiers.host.fraction=0.7")

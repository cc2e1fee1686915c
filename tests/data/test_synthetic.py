"""Synthetic logs: deterministic by seed, day layout with markers, readable, a real signal."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from daskhps.data import criteo_schema, read_click_log
from daskhps.data.synthetic import GeneratorConfig, auc_from_histograms, generate
from daskhps.errors import ConfigError


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("part-*"))
    }


def test_layout_determinism_and_summary(tmp_path: Path) -> None:
    cfg = GeneratorConfig(days=2, rows_per_day=3000, parts_per_day=3, seed=7)
    a = generate(cfg, tmp_path / "a", scheduler="threads", num_workers=2)
    b = generate(cfg, tmp_path / "b", scheduler="sync")
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    generate(GeneratorConfig(days=1, rows_per_day=3000, parts_per_day=3, seed=8), tmp_path / "c")
    assert (
        _digest(tmp_path / "c")["day=2024-01-01/part-00000.tsv"]
        != _digest(tmp_path / "a")["day=2024-01-01/part-00000.tsv"]
    )
    for day in ("2024-01-01", "2024-01-02"):
        folder = tmp_path / "a" / f"day={day}"
        assert (folder / "_SUCCESS").exists()
        assert sorted(p.name for p in folder.glob("part-*")) == [
            f"part-0000{i}.tsv" for i in range(3)
        ]
    meta = json.loads((tmp_path / "a" / "generation.json").read_text())
    assert meta["rows"] == 6000 == a.rows
    assert meta["ceiling_auc"] == pytest.approx(b.ceiling_auc)
    assert 0.7 < a.ceiling_auc < 0.9
    assert 0.2 < a.ctr < 0.3
    assert set(meta["days"]) == {"2024-01-01", "2024-01-02"}


def test_reads_back_without_bad_rows(tmp_path: Path) -> None:
    generate(GeneratorConfig(rows_per_day=4000, parts_per_day=2, gzip=True), tmp_path)
    log = read_click_log(str(tmp_path), criteo_schema())
    frame = log.frame.compute()
    report = log.compute_report()
    assert len(frame) == 4000 and report.total == 0
    # Realistic missing rates: C22 is ~76% missing in Criteo, C1 never.
    missing = (frame["C22"] == frame["C22"].mode()[0]).mean()
    assert 0.7 < missing < 0.82
    # Power law: the most frequent value of a large field is far above uniform.
    top = frame["C3"].value_counts().iloc[0] / len(frame)
    assert top > 0.05


def test_power_law_exponent_changes_concentration(tmp_path: Path) -> None:
    tops = []
    for i, a in enumerate((0.8, 1.6)):
        out = tmp_path / str(i)
        generate(GeneratorConfig(rows_per_day=3000, parts_per_day=1, exponent=a), out)
        frame = read_click_log(str(out)).frame.compute()
        tops.append(frame["C12"].value_counts().iloc[0])
    assert tops[1] > 3 * tops[0]


def test_auc_from_histograms_matches_exact() -> None:
    rng = np.random.default_rng(0)
    p = rng.random(5000)
    y = rng.random(5000) < p
    bins = np.minimum((p * 65536).astype(int), 65535)
    hist = np.stack([np.bincount(bins[y == k], minlength=65536) for k in (0, 1)])
    order = np.argsort(p)
    ranks = np.empty(5000)
    ranks[order] = np.arange(1, 5001)
    npos = y.sum()
    exact = (ranks[y].sum() - npos * (npos + 1) / 2) / (npos * (5000 - npos))
    assert auc_from_histograms(hist) == pytest.approx(exact, abs=1e-4)


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="rows_per_day"):
        GeneratorConfig(rows_per_day=0)
    with pytest.raises(ConfigError, match="start_day"):
        GeneratorConfig(start_day="2024-02-30")
    with pytest.raises(ConfigError, match=r"gen\.yaml: colour: unknown key"):
        GeneratorConfig.from_dict({"colour": 1}, "gen.yaml")
    assert GeneratorConfig.from_dict({"days": 2, "exponent": 1}).exponent == 1.0

"""Synthetic logs: deterministic by seed, day layout with markers, readable, a real signal."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from daskhps.data import criteo_schema, read_click_log, synthetic
from daskhps.data.generation import auc_from_histograms
from daskhps.data.synthetic import GeneratorConfig, generate
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


def test_without_drift_or_one_offs_the_logs_are_as_they_always_were(tmp_path: Path) -> None:
    # The digest of these parts as written before drift and one_off existed: runs, caches and
    # benchmarks made on generated logs stay valid.
    kw = {"days": 3, "rows_per_day": 5000, "parts_per_day": 2, "seed": 11}
    generate(GeneratorConfig(**kw), tmp_path / "a", scheduler="sync")
    generate(GeneratorConfig(**kw, drift=0.0, one_off=0.0), tmp_path / "b", scheduler="sync")
    parts = _digest(tmp_path / "a")
    assert hashlib.sha256("".join(sorted(parts.values())).encode()).hexdigest() == (
        "7d71348b506cc36f1645fe4c4b54b91760b2dbc61d28082c8b8b19320f41c82f"
    )
    assert _digest(tmp_path / "b") == parts


def test_drift_gives_a_share_rho_of_slots_a_new_key_each_day_at_every_popularity() -> None:
    cfg = GeneratorConfig(drift=0.05)
    model = synthetic._make_model(cfg)
    for ranks in (np.arange(1, 20_001), np.arange(400_001, 600_001)):  # the head and the tail
        salts = np.stack([synthetic._slot_salts(cfg, model, 2, ranks, d) for d in range(41)])
        changed = salts[1:] != salts[:-1]
        assert changed.mean(axis=1) == pytest.approx(0.05, abs=0.01)
        # A key that dies is never drawn again: each slot's salt changes at most once a day
        # and never goes back to an earlier one.
        firsts = np.argmax(salts[:, None, :] == salts[None, :, :], axis=1)
        assert (np.diff(firsts, axis=0) >= 0).all()
        assert (changed.sum(axis=0) == 2).all()  # 40 days at 0.05: every slot twice
    assert (
        synthetic._slot_salts(cfg, model, 2, np.arange(1, 100), 0) == model.field_salts[2]
    ).all()


def _columns(folder: Path) -> np.ndarray:
    """Every field of every row as written (strings, "" where missing), days in order."""
    parts = sorted(folder.glob("day=*/part-*"))
    return np.concatenate(
        [pacsv.read_csv(p, read_options=_NO_HEADER, parse_options=_TABS,
                        convert_options=_TEXT).to_pandas().to_numpy() for p in parts]
    )  # fmt: skip


_NO_HEADER = pacsv.ReadOptions(autogenerate_column_names=True)
_TABS = pacsv.ParseOptions(delimiter="\t", quote_char=False)
_TEXT = pacsv.ConvertOptions(
    column_types={f"f{i}": pa.string() for i in range(40)}, strings_can_be_null=False
)


def _categorical(folder: Path) -> np.ndarray:
    """The categorical values as integers (-1 where missing): numpy sets of strings are slow."""
    text = _columns(folder)[:, 14:]
    return np.array([[int(v, 16) if v else -1 for v in row] for row in text], dtype=np.int64)


def test_one_offs_replace_a_share_of_the_values_present_and_nothing_else(tmp_path: Path) -> None:
    kw = {"rows_per_day": 8000, "parts_per_day": 2, "seed": 3}
    generate(GeneratorConfig(**kw), tmp_path / "plain", scheduler="sync")
    generate(GeneratorConfig(**kw, one_off=0.2), tmp_path / "once", scheduler="sync")
    plain, once = _categorical(tmp_path / "plain"), _categorical(tmp_path / "once")
    present = plain >= 0
    replaced = plain != once
    assert not (replaced & ~present).any()  # a missing value stays missing
    assert replaced[present].mean() == pytest.approx(0.2, abs=0.01)
    values, counts = np.unique(once[replaced], return_counts=True)
    assert (counts == 1).mean() > 0.999  # seen once
    assert np.isin(values, plain[present]).mean() < 1e-3  # new keys, not ones the log has
    dense = slice(1, 14)
    assert (_columns(tmp_path / "plain")[:, dense] == _columns(tmp_path / "once")[:, dense]).all()


def test_one_offs_of_days_generated_apart_are_still_seen_once(tmp_path: Path) -> None:
    kw = {"rows_per_day": 4000, "parts_per_day": 1}
    generate(GeneratorConfig(**kw), tmp_path / "plain", scheduler="sync")
    generate(GeneratorConfig(**kw, one_off=0.3), tmp_path / "a", scheduler="sync")
    later = GeneratorConfig(**kw, one_off=0.3, start_day="2024-01-02")
    generate(later, tmp_path / "b", scheduler="sync")
    assert later.day_numbers() == [1]
    # The rows of a run's first day come from the same stream whatever its date; their
    # one-offs must not, or a day generated later would repeat the one-offs of the first.
    plain = _categorical(tmp_path / "plain")
    a, b = _categorical(tmp_path / "a"), _categorical(tmp_path / "b")
    once_a, once_b = a[a != plain], b[b != plain]
    assert len(once_a) > 20000 and len(np.intersect1d(once_a, once_b)) < 0.001 * len(once_a)


def test_drifting_days_keep_a_ceiling_auc(tmp_path: Path) -> None:
    cfg = GeneratorConfig(days=4, rows_per_day=20000, parts_per_day=2, drift=0.2, one_off=0.1)
    summary = generate(cfg, tmp_path, scheduler="sync")
    aucs = [day["ceiling_auc"] for day in summary.days.values()]
    assert all(0.75 < auc < 0.82 for auc in aucs), aucs
    stable = GeneratorConfig(days=4, rows_per_day=20000, parts_per_day=2, one_off=0.1)
    generate(stable, tmp_path / "stable", scheduler="sync")

    def kept(folder: Path) -> float:
        """The share of the last day's values present that the first day had."""
        days = _categorical(folder)
        first, last = days[:20000], days[-20000:]
        return float(np.isin(last[last >= 0], first).mean())

    assert kept(tmp_path) < kept(tmp_path / "stable") - 0.05  # keys die, new ones are born

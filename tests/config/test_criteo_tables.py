"""configs/criteo_tables.yaml: criteo.yaml with each field at the dim its Criteo Kaggle
vocabulary gets from scripts/bench_tables.py's rule, the counts in its comment being the
script's."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from daskhps.config import load_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_tables  # noqa: E402

CONFIG = ROOT / "configs" / "criteo_tables.yaml"


def test_every_field_has_the_dim_of_its_vocabulary() -> None:
    cfg = load_config(CONFIG)
    want = bench_tables.field_dims(bench_tables.CRITEO_KAGGLE_VOCAB)
    names = cfg.data.schema.categorical_names
    assert dict(zip(names, cfg.field_dims(), strict=True)) == want
    # each dim is one table: the widest fields in the default table, as in criteo.yaml
    tables = cfg.embedding_tables()
    assert sorted(t.dim for t in tables) == sorted(set(want.values()))
    assert tables[-1].name == cfg.table.name and tables[-1].dim == max(want.values())


def test_the_comment_lists_the_vocabularies_the_rule_used() -> None:
    comment = "\n".join(x for x in CONFIG.read_text().splitlines() if x.startswith("#"))
    listed = {f"C{n}": int(v.replace(",", "")) for n, v in re.findall(r"C(\d+) ([\d,]+)", comment)}
    assert listed == {f"C{i + 1}": v for i, v in enumerate(bench_tables.CRITEO_KAGGLE_VOCAB)}


def test_it_is_criteo_yaml_but_for_the_tables() -> None:
    plain = load_config(ROOT / "configs" / "criteo.yaml").to_dict()
    tables = load_config(CONFIG).to_dict()
    assert tables.pop("tables") and not plain.pop("tables", None)
    for d in (plain, tables):
        d["run"].pop("name"), d["run"].pop("dir"), d["table"]["tiers"].pop("store_dir")
    assert tables == plain

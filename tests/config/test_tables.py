"""The ``tables`` section: entries filled in from ``table``, the resolved view of the run's
embedding tables, the round trip, and one located line for every bad entry."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from daskhps.config import RunConfig, load_config
from daskhps.config.json_schema import json_schema
from daskhps.config.table import AdmissionConfig, ExpiryConfig
from daskhps.config.tables import TableEntry
from daskhps.errors import ConfigError
from daskhps.table.optimizers import OptimizerSpec
from daskhps.table.spec import TableSpec
from tests.config.helpers import MINIMAL, error, load, located, write

CRITEO = tuple(f"C{i}" for i in range(1, 27))

# docs/configuration.md's example
EXAMPLE = (
    MINIMAL
    + """\
tables:
  - name: ids
    dim: 32
    features: [C3, C4, C12, C16, C21, C24]
    admission: {min_count: 2}
  - name: small
    dim: 8
    features: [C6, C9, C14, C17, C20, C22, C23, C25]
"""
)


def test_an_entry_takes_what_it_leaves_out_from_the_table_section(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        MINIMAL
        + """\
run: {seed: 9}
table:
  dim: 12
  optimizer: {kind: adam, lr: 0.002, beta1: 0.8}
  init_scale: 0.1
  admission: {min_count: 3, probability: 0.5}
  expiry: {ttl_days: 4, max_rows: 1000}
tables:
  - {name: plain, features: [C1]}
  - name: tuned
    dim: null
    features: [C2]
    optimizer: {lr: 0.1}
    init_scale: null
    seed: 2
    admission: {min_count: 5}
    expiry: {max_rows: null}
""",
    )
    plain, tuned = cfg.tables
    table = cfg.table
    assert plain == TableEntry(
        name="plain",
        dim=12,
        features=("C1",),
        optimizer=table.optimizer,
        init_scale=0.1,
        seed=9,  # table.seed, which is run.seed
        admission=table.admission,
        expiry=table.expiry,
    )
    # a written mapping changes only its keys; null is the table's, but init_scale's null is
    # 1/sqrt(dim) as in the table section
    assert tuned.dim == 12 and tuned.init_scale is None and tuned.seed == 2
    assert tuned.optimizer == OptimizerSpec(kind="adam", lr=0.1, beta1=0.8)
    assert tuned.admission == AdmissionConfig(min_count=5, probability=0.5)
    assert tuned.expiry == ExpiryConfig(ttl_days=4, max_rows=None)
    assert tuned.admission_rule == tuned.admission.rule(2)
    assert plain.shared_keys is False


def test_the_resolved_view_of_the_documented_example(tmp_path: Path) -> None:
    cfg = load(tmp_path, EXAMPLE + "table: {dim: 16}\nmodel: {name: deepfm}\n")
    ids, small, rest = cfg.embedding_tables()
    assert (ids.name, small.name, rest.name) == ("ids", "small", "embeddings")
    assert ids.features == ("C3", "C4", "C12", "C16", "C21", "C24")
    assert small.features == ("C6", "C9", "C14", "C17", "C20", "C22", "C23", "C25")
    assert rest.features == tuple(f for f in CRITEO if f not in ids.features + small.features)
    assert rest == TableEntry(name="embeddings", dim=16, features=rest.features)
    assert ids.admission.min_count == 2 and small.admission.min_count == 1
    #            C1 C2 C3 C4 C5 C6 C7 C8 C9 ...
    want = (2, 2, 0, 0, 2, 1, 2, 2, 1, 2, 2, 0, 2, 1, 2, 0, 1, 2, 2, 1, 0, 1, 1, 0, 1, 2)
    assert cfg.field_tables() == want
    assert cfg.field_dims() == tuple((32, 8, 16)[t] for t in want)
    opt = OptimizerSpec()
    # deepfm reads one column more than dim (its first-order weight)
    assert cfg.table_specs() == (
        TableSpec("ids", 33, opt, 0, None),
        TableSpec("small", 9, opt, 0, None),
        TableSpec("embeddings", 17, opt, 0, None),
    )
    assert cfg.several_tables
    one = r"^this needs one table; the config has tables ids, small, embeddings$"
    with pytest.raises(ConfigError, match=one):
        cfg.table_spec()


def test_without_tables_the_one_table_is_todays(tmp_path: Path) -> None:
    cfg = load(tmp_path, MINIMAL + "table: {dim: 8, seed: 4, init_scale: 0.5}\n")
    t = cfg.table
    assert cfg.tables == () and "tables" not in cfg.to_dict()
    assert cfg.embedding_tables() == (
        TableEntry(
            name=t.name,
            dim=8,
            features=CRITEO,
            optimizer=t.optimizer,
            init_scale=0.5,
            seed=4,
            admission=t.admission,
            expiry=t.expiry,
        ),
    )
    today = TableSpec(t.name, cfg.model.sparse_dim(t.dim), t.optimizer, t.seed, t.init_scale)
    assert cfg.table_specs() == (today,) and cfg.table_spec() == today
    assert cfg.sparse_dim == 8 and not cfg.several_tables
    assert cfg.field_tables() == (0,) * 26 and cfg.field_dims() == (8,) * 26


def test_tables_listing_every_field_leave_no_default_table(tmp_path: Path) -> None:
    # the one listed table may then take the default table's name
    cfg = load(
        tmp_path, MINIMAL + "tables:\n  - {name: embeddings, dim: 4, features: ['C{1..26}']}\n"
    )
    (only,) = cfg.embedding_tables()
    assert only.features == CRITEO and not cfg.several_tables
    assert cfg.table_spec() == TableSpec("embeddings", 4, OptimizerSpec(), 0, None)
    two = load(tmp_path, MINIMAL + "tables:\n  - {name: a, features: ['C{1..13}']}\n"
               "  - {name: b, features: ['C{14..26}'], shared_keys: true}\n")  # fmt: skip
    assert [t.name for t in two.embedding_tables()] == ["a", "b"]
    assert two.field_tables() == (0,) * 13 + (1,) * 13
    assert [t.shared_keys for t in two.tables] == [False, True]


def test_a_feature_may_say_its_tables_dim(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        MINIMAL + "tables:\n  - name: ids\n    dim: 32\n    features: [C3, {name: C4, dim: 32}, "
        "{name: 'C{5..6}'}]\n",
    )
    assert cfg.tables[0].features == ("C3", "C4", "C5", "C6")
    assert cfg.to_dict()["tables"][0]["features"] == ["C3", "C4", "C5", "C6"]


def test_round_trip_through_to_dict_and_a_yaml_file(tmp_path: Path) -> None:
    cfg = load(tmp_path, EXAMPLE + "table: {optimizer: {kind: adam}, expiry: {ttl_days: 3}}\n")
    d = cfg.to_dict()
    assert list(d)[:5] == ["run", "data", "passes", "table", "tables"]
    assert d["tables"][0] == {
        "name": "ids",
        "dim": 32,
        "features": ["C3", "C4", "C12", "C16", "C21", "C24"],
        "shared_keys": False,
        "optimizer": OptimizerSpec(kind="adam").to_dict(),
        "init_scale": None,
        "seed": 0,
        "admission": {"min_count": 2, "probability": 1.0},
        "expiry": {"ttl_days": 3, "max_rows": None, "score": "lfu"},
        "tiers": None,
    }
    assert RunConfig.from_dict(d) == cfg
    again = load_config(write(tmp_path, cfg.to_yaml(), "config.yaml"))
    assert again == cfg and again.to_dict() == d
    # what the table section would fill in no longer matters: the entries are explicit
    d["table"]["dim"] = 64
    assert RunConfig.from_dict(d).tables == cfg.tables


def test_the_json_schema_describes_tables() -> None:
    validator = jsonschema.Draft202012Validator(json_schema())
    raw = {
        "data": {"generate": {}},
        "tables": [
            {"name": "ids", "dim": 32, "features": ["C3", {"name": "C4", "dim": 32}]},
            {"name": "small", "features": ["C{5..6}"], "admission": {"min_count": 2}},
        ],
    }
    assert [e.message for e in validator.iter_errors(raw)] == []
    cfg = RunConfig.from_dict(raw)
    assert [e.message for e in validator.iter_errors(cfg.to_dict())] == []
    for bad in ({"name": "x", "features": ["C1"], "dim": 0}, {"name": "x", "features": []},
                {"name": "x", "features": ["C1"], "dimm": 3}, {"features": ["C1"]}):  # fmt: skip
        with pytest.raises(ConfigError):
            RunConfig.from_dict({**raw, "tables": [bad]})
        assert list(validator.iter_errors({**raw, "tables": [bad]})), bad


def _line(text: str, needle: str) -> int:
    """The last line of ``text`` that holds ``needle`` (1-based)."""
    return max(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


TWO = MINIMAL + "tables:\n  - name: ids\n    dim: 32\n    features: [C3, C4]\n"
# (config text, dotted key, text of its line, words the message must hold)
CASES = [
    (TWO + "  - name: small\n    features: [C5, C3]\n", "tables[1].features[1]",
     "features: [C5, C3]", "'C3' is already in table 'ids' (tables[0]); a feature belongs to one"),
    (TWO + "  - name: small\n    features:\n      - C5\n      - C4\n", "tables[1].features[1]",
     "- C4", "already in table 'ids'"),
    (MINIMAL + "tables:\n  - name: t\n    features: ['C{1..3}', C2]\n", "tables[0].features[1]",
     "features:", "'C2' is listed before (tables[0].features[0])"),
    (MINIMAL + "tables:\n  - name: t\n    features:\n      - C3\n      - C99\n",
     "tables[0].features[1]", "- C99",
     "'C99' is not a field of the schema; a table holds categorical fields (C1, C2, C3, C4, C5, "
     "C6, C7, C8, ... (26 fields))"),
    (MINIMAL + "tables:\n  - name: t\n    features: [I2]\n", "tables[0].features[0]",
     "features:", "'I2' is a dense field"),
    (MINIMAL + "tables:\n  - name: t\n    features: []\n", "tables[0].features", "features:",
     "a table holds at least one categorical field"),
    (MINIMAL + "tables:\n  - name: t\n    dim: 8\n", "tables[0].features", "- name: t",
     "required key is missing"),
    (MINIMAL + "tables:\n  - dim: 8\n    features: [C1]\n", "tables[0].name", "- dim: 8",
     "required key is missing"),
    (TWO + "  - name: ids\n    features: [C5]\n", "tables[1].name", "  - name: ids",
     "'ids' is the name of tables[0] too"),
    (MINIMAL + "tables:\n  - name: embeddings\n    features: [C5]\n", "tables[0].name",
     "name: embeddings", "the default table's name (table.name)"),
    (TWO + "    dimm: 3\n", "tables[0].dimm", "dimm", "did you mean 'tables[0].dim'"),
    (TWO + "    optimizer: {lr: 0}\n", "tables[0].optimizer.lr", "optimizer:", "must be > 0"),
    (TWO + "    optimizer: {kind: sgd, row_wise: true}\n", "tables[0].optimizer", "optimizer:",
     "adagrad only"),
    (TWO + "    admission:\n      min_count: 0\n", "tables[0].admission.min_count", "min_count",
     ">= 1"),
    (MINIMAL + "tables:\n  - name: 'a b'\n    features: [C1]\n", "tables[0].name", "'a b'",
     "letters"),
    (MINIMAL + "tables:\n  - name: t\n    features: ['C{3..1}']\n", "tables[0].features[0]",
     "features:", "empty range"),
    (MINIMAL + "tables: {name: t}\n", "tables", "tables:", "expected a list of tables"),
    (MINIMAL + "tables:\n  - name: ids\n    dim: 32\n    features:\n      - C3\n"
     "      - name: C4\n        dim: 16\n", "tables[0].features[1].dim", "dim: 16",
     "16 differs from the table's dim 32; the features of a table share its dim"),
    (MINIMAL + "table: {dim: 8}\ntables:\n  - name: t\n    features:\n      - {name: C4, "
     "dim: 16}\n", "tables[0].features[0].dim", "{name: C4", "differs from the table's dim 8"),
    (MINIMAL + "tables:\n  - name: t\n    features:\n      - {name: C4, size: 16}\n",
     "tables[0].features[0].size", "{name: C4", "mapping with keys name, dim"),
    (MINIMAL + "tables:\n  - name: t\n    features: [7]\n", "tables[0].features[0]", "features:",
     "expected a field name"),
    # a required key misspelled: the misspelling's line and the key it should be, not the
    # entry's first line saying the key is missing
    (TWO + "  - name: small\n    dim: 8\n    featurs: [C5]\n", "tables[1].featurs", "featurs",
     "unknown key; did you mean 'tables[1].features'?"),
    (MINIMAL + "tables:\n  - features: [C1]\n    nmae: t\n", "tables[0].nmae", "nmae",
     "did you mean 'tables[0].name'?"),
    # a feature's own dim is checked as a dim before it is compared with the table's
    (MINIMAL + "tables:\n  - name: t\n    dim: 8\n    features:\n      - {name: C12, dim: 0}\n",
     "tables[0].features[0].dim", "{name: C12", "must be >= 1, got 0"),
    (MINIMAL + "tables:\n  - name: t\n    features:\n      - {name: C12, dim: -4}\n",
     "tables[0].features[0].dim", "{name: C12", "must be >= 1, got -4"),
    (MINIMAL + "tables:\n  - name: t\n    dim: 8\n    features:\n      - {name: C12, dim: 8.5}\n",
     "tables[0].features[0].dim", "{name: C12", "expected int, got float 8.5"),
    (MINIMAL + "tables:\n  - name: t\n    features:\n      - C3\n      - {dim: 8}\n",
     "tables[0].features[1]", "{dim: 8}", "expected a field name or a mapping with keys name"),
    (MINIMAL + "tables:\n  - name: t\n    features:\n      - {name: C4, dimm: 16}\n",
     "tables[0].features[0].dimm", "{name: C4", "unknown key; did you mean 'dim'?"),
    (MINIMAL + "tables:\n  - name: t\n    features:\n      - {name: C1, dim: 32}\n",
     "tables[0].features[0].dim", "{name: C1", "32 differs from the table's dim 16 (table.dim: "
     "the entry writes no dim); the features of a table share its dim: write dim: 32 in the "
     "entry, list 'C1' in a table of dim 32, or drop its dim"),
    # a field of a range says which range named it; a field in another case, which field
    (MINIMAL + "tables:\n  - name: t\n    features: ['C{20..30}']\n", "tables[0].features[0]",
     "features:", "'C27' (of 'C{20..30}') is not a field of the schema"),
    (MINIMAL + "tables:\n  - name: t\n    features:\n      - C{1..3}\n      - C{2..4}\n",
     "tables[0].features[1]", "C{2..4}", "'C2' (of 'C{2..4}') is listed before"),
    (MINIMAL + "tables:\n  - name: t\n    features: [C1, c3]\n", "tables[0].features[1]",
     "features:", "'c3' is not a field of the schema; did you mean 'C3'?"),
    # null in YAML's words
    (MINIMAL + "tables:\n  - name:\n    features: [C1]\n", "tables[0].name", "- name:",
     "expected str, got null"),
    (TWO + "    tiers: {policy: fifo}\n", "tables[0].tiers.policy", "tiers:",
     "'fifo' is not allowed; choose one of null, 'lru', 'lfu'"),
    (TWO + "    optimizer: {kind: null}\n", "tables[0].optimizer.kind", "optimizer:",
     "null is not allowed; choose one of 'sgd'"),
    # an entry left empty is no table of defaults: its name and features are required
    (TWO + "  -\n", "tables[1]", "  -", "expected a mapping with keys name, dim, features"),
    # a whole float too large to be an int, as for any int
    (MINIMAL + "tables:\n  - name: t\n    features:\n      - {name: C1, dim: 1e300}\n",
     "tables[0].features[0].dim", "{name: C1", "expected int, got float 1e+300"),
    # a key of an entry's sub-mappings misspelled
    (TWO + "    expiry:\n      ttl: 2\n", "tables[0].expiry.ttl", "ttl:",
     "did you mean 'tables[0].expiry.ttl_days'?"),
    (TWO + "    tiers:\n      devise: {rows: 10}\n", "tables[0].tiers.devise", "devise",
     "did you mean 'tables[0].tiers.device'?"),
    (TWO + "    tiers: {device: {rowz: 10}}\n", "tables[0].tiers.device.rowz", "tiers:",
     "did you mean 'tables[0].tiers.device.rows'?"),
    (TWO + "    optimizer:\n      kindd: adam\n", "tables[0].optimizer.kindd", "kindd",
     "did you mean 'tables[0].optimizer.kind'?"),
    (TWO + "    admission: {min_cnt: 2}\n", "tables[0].admission.min_cnt", "admission:",
     "did you mean 'tables[0].admission.min_count'?"),
    # a model that needs one width, given two
    (TWO + "model:\n  name: dlrm\n  options:\n    field_projection: false\n",
     "model.options.field_projection", "field_projection: false",
     "widths 16 and 32 (table 'ids': dim 32; table 'embeddings': dim 16); set "
     "model.options.field_projection to true"),
    (TWO + "model:\n  name: tests.models.user_model:TinyModel\n", "model.name", "TinyModel",
     "takes one embedding_dim for every field, but the tables give the fields widths 16 and 32"),
    # a table's own tiers count beside the run's
    (TWO + "    tiers: {host: {fraction: 0.3}}\n", "tables[0].tiers", "tiers:",
     "ids's host.fraction 0.3"),
    # every table has its tiers on every worker: three tables of device.rows do not fit
    (EXAMPLE + "cluster: {memory_limit: 1GiB}\ntable:\n  tiers:\n    device: {rows: 1000000}\n",
     "table.tiers", "  tiers:", "each of the 3 tables (ids, small, embeddings)"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "key", "at", "words"), CASES, ids=[c[1] for c in CASES])
def test_a_bad_entry_is_one_located_line(
    tmp_path: Path, text: str, key: str, at: str, words: str
) -> None:
    msg = error(tmp_path, text)
    assert located(msg, tmp_path / "run.yaml", key, _line(text, at)), msg
    assert words in msg and "\n" not in msg, msg


def test_one_table_of_those_rows_fits(tmp_path: Path) -> None:
    # the memory case above is refused for its tables, not its rows
    load(tmp_path, MINIMAL + "cluster: {memory_limit: 1GiB}\ntable:\n  tiers:\n"
         "    device: {rows: 1000000}\n")  # fmt: skip


def test_more_than_127_tables(tmp_path: Path) -> None:
    schema = "{name: s, format: parquet, label: y, categorical: ['f{1..130}']}"
    head = f"data:\n  train: {{paths: logs}}\n  schema: {schema}\ntables:\n"

    def listed(n: int) -> str:
        return "".join(f"  - {{name: t{i}, features: [f{i}]}}\n" for i in range(1, n + 1))

    assert len(load(tmp_path, head + listed(126)).embedding_tables()) == 127  # the default too
    msg = error(tmp_path, head + listed(127))
    assert msg == (
        f"{tmp_path / 'run.yaml'}:4: tables: 128 tables (the default table included) is more "
        "than 127; a key holds its table's index in 7 bits"
    )


def test_set_takes_the_list_whole(tmp_path: Path) -> None:
    cfg = load(tmp_path, MINIMAL, "tables=[{name: ids, dim: 32, features: [C3, C4]}]")
    assert cfg.field_dims()[2:4] == (32, 32)
    for key in ("tables.dim", "tables[0].dim", "tables.0.dim"):  # not "did you mean tables.dim"
        msg = error(tmp_path, MINIMAL, f"{key}=8")
        assert f"(--set {key}): {key}: tables is a list; set it whole" in msg, msg
        assert "\n" not in msg


@pytest.mark.parametrize(
    ("value", "key", "words"),
    [
        ("[{name: a, features: [C99]}]", "tables[0].features[0]", "'C99' is not a field"),
        ("[{name: a, dim: -3, features: [C1]}]", "tables[0].dim", "must be >= 1, got -3"),
        ("[{name: a, featurs: [C1]}]", "tables[0].featurs", "did you mean 'tables[0].features'"),
        ("[{name: a, features: [C1]}, {name: a, features: [C2]}]", "tables[1].name",
         "'a' is the name of tables[0] too"),
    ],
)  # fmt: skip
def test_an_error_inside_a_set_list_names_the_set(
    tmp_path: Path, value: str, key: str, words: str
) -> None:
    # the file's own tables (whose lines the file has) are replaced by the --set value
    msg = error(tmp_path, TWO + "  - name: b\n    dim: 8\n    features: [C1, C2]\n",
                f"tables={value}")  # fmt: skip
    assert located(msg, Path(f"{tmp_path / 'run.yaml'} (--set tables)"), key), msg
    assert words in msg and "\n" not in msg, msg


@pytest.mark.parametrize("features", ["[C{1..3}, C4]", "[C4, C{1..3}]", "[C4, {name: C{1..3}}]"])
def test_an_unquoted_range_in_a_flow_list_says_to_quote_it(tmp_path: Path, features: str) -> None:
    # YAML reads the brace as a mapping's start: the file does not load, and says why
    head = MINIMAL + "tables:\n  - name: t\n"
    msg = error(tmp_path, head + f"    features: {features}\n")
    assert msg.startswith(f"{tmp_path / 'run.yaml'}:5: not valid YAML ("), msg
    assert msg.endswith('YAML reads the brace of C{1..3} as a mapping; quote it: "C{1..3}"'), msg
    assert "\n" not in msg
    quoted = features.replace("C{1..3}", '"C{1..3}"')
    assert load(tmp_path, head + f"    features: {quoted}\n").tables[0].features == (
        ("C1", "C2", "C3", "C4") if features.startswith("[C{") else ("C4", "C1", "C2", "C3")
    )
    msg = error(tmp_path, MINIMAL, f"tables=[{{name: t, features: {features}}}]")
    assert msg.startswith(f"{tmp_path / 'run.yaml'} (--set tables): tables: not valid YAML"), msg
    assert msg.endswith('quote it: "C{1..3}"'), msg


def test_the_example_of_the_document_is_the_one_tested() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    block = doc.partition("## Several tables")[2].partition("```yaml\n")[2].partition("```")[0]
    assert block == EXAMPLE.removeprefix(MINIMAL)

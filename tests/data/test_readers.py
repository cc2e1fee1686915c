"""Reading shards: every kind of bad input under both policies, gzip, CSV headers, parquet."""

from __future__ import annotations

import gzip
from pathlib import Path

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from daskhps.data import (
    BadRowPolicy,
    BadRowReport,
    DataSource,
    Schema,
    hash_column,
    load_schema,
    missing_key,
    read_click_log,
    read_shard,
    resolve_files,
)
from daskhps.errors import ConfigError, DataError

SCHEMA = Schema.from_dict(
    {
        "name": "mini",
        "columns": ["label", "I1", "I2", "C1", "C2"],
        "label": "label",
        "dense": ["I1", "I2"],
        "categorical": ["C1", "C2"],
    }
)

# One line of each kind of bad row; comments give the expected reason.
LINES = [
    "1\t5\t\t68fd1e64\taa",  # 1 good (I2 missing)
    "0\t-3\t7\t\tbb",  # 2 good (C1 missing; I1 clipped to 0)
    "1\t2\t3\tcc",  # 3 wrong_column_count (4 fields)
    "2\t1\t1\tx\ty",  # 4 label_invalid
    "\t1\t1\tx\ty",  # 5 label_invalid (missing label)
    "1\tabc\t2\tx\ty",  # 6 dense_not_numeric
    "",  # 7 wrong_column_count (blank line)
    "0\t1\t2\t3\t4\t5",  # 8 wrong_column_count (6 fields)
    "0\t1.5e1\tnan\tx\ty",  # 9 dense_not_numeric (nan)
    "0\t\t\t\t",  # 10 good (everything missing)
]
GOOD_LINES = [1, 2, 10]
EXPECTED = {"wrong_column_count": 3, "label_invalid": 2, "dense_not_numeric": 2}


def _write(path: Path, lines: list[str], gz: bool = False) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_skip_counts_every_reason(tmp_path: Path, gz: bool) -> None:
    p = _write(tmp_path / ("a.tsv.gz" if gz else "a.tsv"), LINES, gz)
    frame, report = read_shard(str(p), SCHEMA)
    assert report.by_reason() == EXPECTED
    assert report.by_shard() == {str(p): EXPECTED}
    assert report.rows_read == len(GOOD_LINES) == len(frame)
    assert frame["label"].tolist() == [1.0, 0.0, 0.0]
    assert frame["I1"].tolist() == pytest.approx([np.log1p(5), 0.0, 0.0])
    assert frame["I2"].tolist() == pytest.approx([0.0, np.log1p(7), 0.0])
    assert frame["C1"].tolist() == [
        hash_column(["68fd1e64"], "C1")[0],
        missing_key("C1"),
        missing_key("C1"),
    ]
    assert list(frame.dtypes) == ["float32"] * 3 + ["int64"] * 2


@pytest.mark.parametrize(
    ("bad_line", "line_no", "what"),
    [
        ("1\t2\t3\tcc", 2, "expected 5 columns, got 4"),
        ("2\t1\t1\tx\ty", 2, "label '2' is not 0 or 1"),
        ("1\t1\tabc\tx\ty", 2, "dense column I2 is not a number: 'abc'"),
        ("", 2, "blank line"),
        ("0\t1\t2\t3\t4\t5", 2, "expected 5 columns, got 6"),
    ],
)
def test_fail_names_file_line_and_problem(
    tmp_path: Path, bad_line: str, line_no: int, what: str
) -> None:
    p = _write(tmp_path / "b.tsv", [LINES[0], bad_line, LINES[1]])
    with pytest.raises(DataError) as e:
        read_shard(str(p), SCHEMA, BadRowPolicy(action="fail"))
    assert str(e.value).startswith(f"{p}: line {line_no}: {what}")


def test_fail_reports_the_first_bad_line(tmp_path: Path) -> None:
    p = _write(tmp_path / "c.tsv", LINES)
    with pytest.raises(DataError, match=r"c\.tsv: line 3: expected 5 columns, got 4"):
        read_shard(str(p), SCHEMA, BadRowPolicy(action="fail"))


def test_max_fraction(tmp_path: Path) -> None:
    p = _write(tmp_path / "d.tsv", LINES)
    with pytest.raises(DataError, match="7 of 10 rows are bad"):
        read_shard(str(p), SCHEMA, BadRowPolicy(action="skip", max_fraction=0.5))


@pytest.mark.parametrize(
    ("content", "reason", "message"),
    [
        (b"", "empty_shard", "the file is empty"),
        (gzip.compress(b""), "empty_shard", "the file is empty"),
        (b"\x1f\x8b\x08garbage-not-gzip", "unreadable_shard", "cannot read the file"),
    ],
)
def test_empty_and_unreadable_shards(
    tmp_path: Path, content: bytes, reason: str, message: str
) -> None:
    p = tmp_path / "e.tsv.gz"
    p.write_bytes(content)
    frame, report = read_shard(str(p), SCHEMA)
    assert len(frame) == 0 and report.by_reason() == {reason: 1}
    with pytest.raises(DataError, match=f"{p.name}: {message}"):
        read_shard(str(p), SCHEMA, BadRowPolicy(action="fail"))


def _bytes_lines(lines: list[bytes], gz: bool = False) -> bytes:
    data = b"\n".join(lines) + b"\n"
    return gzip.compress(data) if gz else data


GOOD = [ln.encode() for i, ln in enumerate(LINES, 1) if i in GOOD_LINES]
# Not UTF-8: a latin-1 value (right field count), and binary junk (wrong field count).
LATIN1 = "1\t5\t\tcaf\xe9\taa".encode("latin-1")
JUNK = b"\x89PNG\xff\xfe junk \x00\x01"


@pytest.mark.parametrize("gz", [False, True])
def test_a_line_that_is_not_utf8_is_one_bad_row(
    tmp_path: Path, gz: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    """It used to drop the whole file (unreadable_shard), printing tracebacks and raw bytes."""
    lines = [GOOD[0], LATIN1, GOOD[1], JUNK, GOOD[2], "0\t1\t2\tcaf\u00e9\tb".encode()]
    p = tmp_path / ("u.tsv.gz" if gz else "u.tsv")
    p.write_bytes(_bytes_lines(lines, gz))
    frame, report = read_shard(str(p), SCHEMA)
    assert report.by_shard() == {str(p): {"undecodable": 2}}
    assert report.rows_read == len(frame) == 4
    # the good rows are those of the file without the bad lines; UTF-8 text is kept as is
    ref, _ = read_shard(
        str(_write(tmp_path / "ref.tsv", [ln.decode() for ln in lines[::2]])), SCHEMA
    )
    pd.testing.assert_frame_equal(frame.iloc[[0, 1, 2]].reset_index(drop=True), ref.iloc[:3])
    assert frame["C1"].iloc[3] == hash_column(["caf\u00e9"], "C1")[0]
    with pytest.raises(DataError) as e:
        read_shard(str(p), SCHEMA, BadRowPolicy(action="fail"))
    assert str(e.value).startswith(f"{p}: line 2: not UTF-8 text")
    assert "\n" not in str(e.value)
    out, err = capfd.readouterr()
    assert out == "" and "Traceback" not in err and "PNG" not in err, err


def test_undecodable_rows_count_towards_max_fraction(tmp_path: Path) -> None:
    p = tmp_path / "m.tsv"
    p.write_bytes(_bytes_lines([GOOD[0], LATIN1, JUNK, LATIN1]))
    with pytest.raises(DataError, match="3 of 4 rows are bad \\(undecodable=3\\)"):
        read_shard(str(p), SCHEMA, BadRowPolicy(action="skip", max_fraction=0.5))


def test_a_truncated_gzip_file_keeps_its_complete_lines(tmp_path: Path) -> None:
    rows = [f"{i % 2}\t{i}\t{i}\tk{i}\tv{i}".encode() for i in range(3000)]
    whole = _bytes_lines(rows, gz=True)
    p = tmp_path / "t.tsv.gz"
    p.write_bytes(whole[: len(whole) // 2])
    frame, report = read_shard(str(p), SCHEMA)
    assert report.by_reason() == {"truncated_file": 1}
    kept = report.rows_read
    assert 0 < kept < 3000 and len(frame) == kept
    # exactly the first rows of the file, none of them cut
    assert frame["C1"].tolist() == hash_column([f"k{i}" for i in range(kept)], "C1").tolist()
    assert frame["C2"].tolist() == hash_column([f"v{i}" for i in range(kept)], "C2").tolist()
    with pytest.raises(DataError) as e:
        read_shard(str(p), SCHEMA, BadRowPolicy(action="fail"))
    assert str(e.value).startswith(f"{p}: line {kept + 1}: the gzip data ends early")
    # a gzip file of several members is whole; damaged data (a failed check) is unreadable
    q = tmp_path / "two.tsv.gz"
    q.write_bytes(whole + _bytes_lines(rows[:5], gz=True))
    assert read_shard(str(q), SCHEMA)[1].by_shard() == {}
    assert read_shard(str(q), SCHEMA)[1].rows_read == 3005
    damaged = bytearray(whole)
    damaged[-8] ^= 0xFF  # the CRC
    r = tmp_path / "crc.tsv.gz"
    r.write_bytes(bytes(damaged))
    assert read_shard(str(r), SCHEMA)[1].by_reason() == {"unreadable_shard": 1}


def _without_label(lines: list[str]) -> list[str]:
    return [ln.split("\t", 1)[1] if "\t" in ln else ln for ln in lines]


@pytest.mark.parametrize("gz", [False, True])
def test_auto_reads_a_text_log_with_or_without_its_label_column(tmp_path: Path, gz: bool) -> None:
    good = [ln for i, ln in enumerate(LINES, 1) if i in GOOD_LINES]
    ext = ".tsv.gz" if gz else ".tsv"
    labelled = _write(tmp_path / f"l{ext}", good, gz)
    # a blank line and a line of another width first: the first line of 5 or 4 fields decides
    unlabelled = _write(tmp_path / f"u{ext}", ["", "1\t2", *_without_label(good)], gz)
    a, ra = read_shard(str(labelled), SCHEMA, labels="auto")
    b, rb = read_shard(str(unlabelled), SCHEMA, labels="auto")
    assert ra.by_reason() == {} and rb.by_reason() == {"wrong_column_count": 2}
    assert a["label"].tolist() == [1.0, 0.0, 0.0] and b["label"].isna().all()
    pd.testing.assert_frame_equal(a.drop(columns="label"), b.drop(columns="label"))
    # 'absent' reads the same; 'present' (training) finds every unlabelled row too short
    c, _ = read_shard(str(unlabelled), SCHEMA, labels="absent")
    pd.testing.assert_frame_equal(b, c)
    _, rp = read_shard(str(unlabelled), SCHEMA)
    assert rp.by_reason() == {"wrong_column_count": 5}
    _, rl = read_shard(str(labelled), SCHEMA, labels="absent")
    assert rl.by_reason() == {"wrong_column_count": 3}
    with pytest.raises(ConfigError, match="labels 'maybe': choose one of auto, present, absent"):
        read_shard(str(labelled), SCHEMA, labels="maybe")


def test_auto_reads_header_and_parquet_logs_without_the_label(tmp_path: Path) -> None:
    schema = Schema.from_dict(
        {
            "name": "h",
            "format": "csv",
            "header": True,
            "label": "click",
            "dense": ["x"],
            "categorical": ["ad"],
        }
    )
    (tmp_path / "l.csv").write_text("ad,click,x\na1,1,2\na2,0,3\n")
    (tmp_path / "u.csv").write_text("x,ad\n2,a1\n3,a2\n")
    a, _ = read_shard(str(tmp_path / "l.csv"), schema, labels="auto")
    b, rb = read_shard(str(tmp_path / "u.csv"), schema, labels="auto")
    assert rb.by_reason() == {} and b["label"].isna().all()
    pd.testing.assert_frame_equal(a.drop(columns="label"), b.drop(columns="label"))
    assert read_shard(str(tmp_path / "u.csv"), schema)[1].by_reason() == {"schema_mismatch": 1}
    pschema = Schema.from_dict({**schema.to_dict(), "format": "parquet", "header": False})
    pq.write_table(pa.table({"x": [2.0, 3.0], "ad": ["a1", "a2"]}), tmp_path / "u.parquet")
    c, rc = read_shard(str(tmp_path / "u.parquet"), pschema, labels="auto")
    assert rc.by_reason() == {} and c["label"].isna().all()
    pd.testing.assert_frame_equal(b, c)
    d, _ = read_shard(str(tmp_path / "l.csv"), schema, labels="absent")  # label not read
    pd.testing.assert_frame_equal(b, d)


def test_paths_that_match_nothing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="matched nothing"):
        read_click_log(str(tmp_path / "nothing-*.tsv"), SCHEMA)
    with pytest.raises(DataError, match="matched nothing"):
        read_click_log(str(tmp_path), SCHEMA)  # an empty directory


def test_dask_reader_reads_each_file_once_and_merges_reports(tmp_path: Path) -> None:
    for d in ("2024-01-01", "2024-01-02", "2024-01-03"):
        (tmp_path / f"day={d}").mkdir()
        _write(tmp_path / f"day={d}" / "part-00000.tsv.gz", LINES, gz=True)
        _write(tmp_path / f"day={d}" / "part-00001.tsv", LINES[:2])
    (tmp_path / "day=2024-01-01" / "_SUCCESS").write_text("")
    (tmp_path / "day=2024-01-02" / "_SUCCESS").write_text("")
    log = read_click_log(
        DataSource(paths=(str(tmp_path),), schema=SCHEMA, days=("2024-01-02", "2024-01-03"))
    )
    assert [Path(f).parent.name for f in log.files] == ["day=2024-01-02"] * 2 + [
        "day=2024-01-03"
    ] * 2
    frame, rep = dask.compute(log.frame, log.report)
    report = BadRowReport.from_frame(rep)
    assert len(frame) == 2 * (len(GOOD_LINES) + 2)
    assert report.by_reason() == {k: 2 * v for k, v in EXPECTED.items()}
    assert len(report.by_shard()) == 2
    complete = resolve_files(str(tmp_path / "day=*" / "part-*"), require_complete=True)
    assert {Path(f).parent.name for f in complete} == {"day=2024-01-01", "day=2024-01-02"}
    strict = read_click_log(
        DataSource(paths=(str(tmp_path),), schema=SCHEMA, bad_rows=BadRowPolicy(action="fail"))
    )
    with pytest.raises(DataError, match=r"part-00000\.tsv\.gz: line 3"):
        strict.frame.compute()


def test_csv_with_header_and_quotes(tmp_path: Path) -> None:
    schema = load_schema(Path(__file__).resolve().parents[2] / "configs/schemas/avazu.yaml")
    header = "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
    header += "app_category,device_id,device_ip,device_model,device_type,device_conn_type,"
    header += ",".join(f"C{i}" for i in range(14, 22))
    row = "1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,"
    row += '7801e8d9,07d7df22,a99f214a,ddd2926e,"44956a24",1,2,15706,320,50,1722,0,35,-1,79'
    p = tmp_path / "train.csv"
    p.write_text("\n".join([header, row, row.replace(",0,1410", ",x,1410")]) + "\n")
    frame, report = read_shard(str(p), schema)
    assert report.by_reason() == {"label_invalid": 1}
    assert frame["site_id"].tolist() == hash_column(["1fbe01fe"], "site_id").tolist()
    assert frame["device_model"].tolist() == hash_column(["44956a24"], "device_model").tolist()
    with pytest.raises(DataError, match=r"train\.csv: line 3: label 'x' is not 0 or 1"):
        read_shard(str(p), schema, BadRowPolicy(action="fail"))
    # A header without a column the schema needs is a schema mismatch.
    q = tmp_path / "other.csv"
    q.write_text("click,hour\n1,14102100\n")
    _, report = read_shard(str(q), schema)
    assert report.by_reason() == {"schema_mismatch": 1}


def test_parquet_and_multi_hot(tmp_path: Path) -> None:
    schema = load_schema(Path(__file__).resolve().parents[2] / "configs/schemas/ads_multi_hot.yaml")
    table = pa.table(
        {
            "clicked": pa.array([1, 0, 3, 0], pa.int64()),
            "price": pa.array([10.0, None, 1.0, 2.0]),
            "age": pa.array([150, 20, 30, None], pa.int64()),
            "ad_id": pa.array([11, 12, 13, 14], pa.int64()),
            "user_id": pa.array(["u1", None, "u3", "u4"]),
            "interests": pa.array(["a|b", None, "c", "|a||"]),
        }
    )
    p = tmp_path / "part-0.parquet"
    pq.write_table(table, p)
    frame, report = read_shard(str(p), schema)
    assert report.by_reason() == {"label_invalid": 1}
    assert frame["label"].tolist() == [1.0, 0.0, 0.0]
    assert frame["age"].tolist() == [100.0, 20.0, 30.0]  # clipped at 100; missing -> fill 30
    assert frame["price"].tolist() == pytest.approx([np.log1p(10.0), 0.0, np.log1p(2.0)])
    # Integer ids hash like their decimal text.
    assert frame["ad_id"].tolist() == hash_column(["11", "12", "14"], "ad_id").tolist()
    lists = frame["interests"].tolist()
    a, b = hash_column(["a", "b"], "interests").tolist()
    assert [list(x) for x in lists] == [[a, b], [missing_key("interests")], [a]]
    with pytest.raises(DataError, match=r"part-0\.parquet: row 3: label 3"):
        read_shard(str(p), schema, BadRowPolicy(action="fail"))
    log = read_click_log(str(tmp_path), schema)
    assert len(log.frame.compute()) == 3


def test_pandas_reader_matches_read_csv(tmp_path: Path) -> None:
    """The reader's keys equal hashing what plain pandas.read_csv sees in the same file."""
    p = _write(tmp_path / "f.tsv", [ln for i, ln in enumerate(LINES, 1) if i in GOOD_LINES])
    frame, _ = read_shard(str(p), SCHEMA)
    ref = pd.read_csv(p, sep="\t", header=None, names=list(SCHEMA.columns), dtype=str)
    for c in ("C1", "C2"):
        assert frame[c].tolist() == hash_column(ref[c], c).tolist()


def test_two_logs_never_share_read_tasks(tmp_path: Path) -> None:
    """Logs of different files (say a training day and a holdout day) with the same number
    of files must not collapse onto the same Dask tasks."""
    from daskhps.data.readers import read_click_log

    a, b = tmp_path / "a.tsv", tmp_path / "b.tsv"
    row = "\t".join(["{}"] + [""] * 13 + ["0000000a"] + [""] * 25) + "\n"
    a.write_text(row.format(1))
    b.write_text(row.format(0))
    la, lb = read_click_log([str(a)]), read_click_log([str(b)])
    assert la.frame["label"].compute().tolist() == [1.0]
    assert lb.frame["label"].compute().tolist() == [0.0]
    both = dask.compute(la.frame["label"].sum(), lb.frame["label"].sum())
    assert both == (1.0, 0.0)

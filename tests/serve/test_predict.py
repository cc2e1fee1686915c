"""Batch scoring and export against a real small training run (LocalCluster, gloo, zarr).

The run, and the jobs given a scheduler, use the session's warm shared clusters
(tests/_clusters.py); the job given none starts its own.

The reference is computed here without the serving code: the dense model from the checkpoint
and each row looked up with ``EmbeddingTable.peek`` in its rank store, in one batch.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from daskhps.cli import main
from daskhps.distributed import start_cluster
from daskhps.errors import DataError
from daskhps.retrain.versions import Registry
from daskhps.runfiles.checkpoint import MANIFEST, latest_checkpoint, list_checkpoints
from daskhps.serve import Servable, ServingLookup, ShardedStores, load_servable
from daskhps.serve.export import EMBEDDINGS, KEYS, META, MODEL, export_model
from daskhps.serve.predict import SUCCESS, SUMMARY, predict
from daskhps.serve.score import CacheSizes, Scorer
from daskhps.table.init import init_embedding
from daskhps.training.metrics import evaluate_predictions
from tests._clusters import SharedClusters
from tests.serve import standalone
from tests.serve.helpers import bits, publish_checkpoint, reference_rows, tree_state

pytestmark = pytest.mark.slow


def _read_out(out: Path) -> pd.DataFrame:
    parts = sorted(out.glob("part-*.parquet"))
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def test_predict_equals_the_trainers_evaluation(run: dict[str, Any]) -> None:
    s, frame = run["servable"], run["frame"]
    stores = Path(run["cfg"].table.tiers.store_dir)
    before = tree_state(stores)
    out = run["tmp"] / "pred"
    res = predict(
        s,
        run["holdout"],
        out,
        sizes=CacheSizes(device_rows=300, host_bytes=64 << 10),  # tiny: every tier is used
        batch_size=256,
    )
    got = _read_out(out)
    assert len(pd.read_parquet(out)) == len(got)  # the folder reads as one dataset
    assert tree_state(stores) == before  # scoring never wrote a store
    assert res.rows == len(frame) == len(got)
    # row ids: (file, row) in read order, one part per input file
    assert [str(f) for f in got["file"].unique()] == run["holdout"]
    for f in run["holdout"]:
        rows = got.loc[got["file"] == f, "row"].to_numpy()
        assert np.array_equal(rows, np.arange(len(rows)))
    prob = got["probability"].to_numpy()
    assert np.abs(prob - run["reference"]).max() < 1e-6
    # the trainer's own evaluation of the same rows, after its last pass
    labels = frame["label"].to_numpy()
    mine = evaluate_predictions(prob, labels, ("auc", "logloss"))
    final = run["result"].final_eval
    assert mine["examples"] == final["examples"]
    assert abs(mine["logloss"] - final["logloss"]) < 1e-6
    assert abs(mine["auc"] - final["auc"]) < 1e-6
    summary = json.loads((out / SUMMARY).read_text())
    assert (out / SUCCESS).exists() and summary["rows"] == len(frame)
    assert summary["lookup_rows_from"]["store"] > 0 and summary["lookup_rows_from"]["host"] > 0


def test_cli_predict_and_its_bad_inputs(
    run: dict[str, Any], capsys: pytest.CaptureFixture[str], shared_clusters: SharedClusters
) -> None:
    """Through ``--scheduler``: an existing cluster serves two jobs (the second fails)."""
    run_dir, tmp = run["cfg"].run.dir, run["tmp"]
    out = tmp / "cli-pred"
    cluster = start_cluster(address=shared_clusters.address(workers=1, threads=2))
    with cluster:
        address = cluster.client.scheduler.address
        args = ["predict", "--model", run_dir, "--out", str(out), "--scheduler", address]
        _cli_cases(run, capsys, args, out)
        # every job closed its scorers on the workers, the failed one too
        assert set(cluster.client.run(_live_scorers).values()) == {0}


def test_one_file_on_one_worker_is_said_in_the_singular(
    run: dict[str, Any], capsys: pytest.CaptureFixture[str], shared_clusters: SharedClusters
) -> None:
    out = run["tmp"] / "one-file"
    address = shared_clusters.address(workers=1, threads=2)
    args = ["predict", "--model", str(run["cfg"].run.dir), "--out", str(out)]
    assert main([*args, "--scheduler", address, "--data", run["holdout"][0]]) == 0
    said = capsys.readouterr().out
    assert "scoring 1 file on 1 worker\n" in said and " rows of 1 file with " in said, said


def _live_scorers() -> int:
    from daskhps.serve import predict as job

    return len(job._SCORERS)


def _cli_cases(
    run: dict[str, Any], capsys: pytest.CaptureFixture[str], args: list[str], out: Path
) -> None:
    run_dir, tmp = run["cfg"].run.dir, run["tmp"]
    assert main([*args, "--data", run["holdout"][0], "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    got = _read_out(out)
    n0 = summary["rows"]
    assert np.abs(got["probability"].to_numpy() - run["reference"][:n0]).max() < 1e-6

    def fails(argv: list[str], *words: str) -> None:
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        for w in words:
            assert w in err, err

    fails([*args, "--data", run["holdout"][0]], "already holds predictions", str(out))
    fails([*args, "--data", str(tmp / "nothing-*.tsv"), "--overwrite"], "nothing-*.tsv")
    torn = Path(run_dir) / "checkpoints" / "pass-000099"
    torn.mkdir()
    (torn / "dense.pt").write_bytes(b"half")
    try:
        fails([*args, "--model", str(torn), "--data", run["holdout"][0]], "MANIFEST.json")
    finally:
        (torn / "dense.pt").unlink()
        torn.rmdir()
    bad = tmp / "other-schema.tsv"
    bad.write_text("1\t2\t3\n0\t5\t6\n")
    fails([*args, "--data", str(bad), "--overwrite"], str(bad), "schema")
    assert not list(out.glob("part-*")) and not (out / SUCCESS).exists()
    # a checkpoint whose stores moved (found by the driver) or lost its commit (by a worker)
    latest = latest_checkpoint(run_dir)
    assert latest is not None
    for key, value, words in (
        ("stores_dir", str(tmp / "moved"), ("no store at", "moved")),
        ("commit", "gone", ("no commit 'gone'",)),
    ):
        copy = tmp / f"edited-{key}" / "checkpoints" / latest.name
        shutil.copytree(latest.path, copy)
        # the copy's stores beside it, where its relative stores_dir finds them
        shutil.copytree(latest.stores_dir, tmp / f"edited-{key}" / "stores")
        manifest = json.loads((copy / MANIFEST).read_text())
        (copy / MANIFEST).write_text(json.dumps({**manifest, key: value}))
        data = ["--data", run["holdout"][0], "--overwrite"]
        fails([*args, "--model", str(copy), *data], *words)


@pytest.fixture(scope="module")
def client(shared_clusters: SharedClusters) -> Iterator[Any]:
    """One small cluster for the predict jobs below (a job without one starts its own)."""
    with start_cluster(address=shared_clusters.address(workers=1, threads=2)) as handle:
        yield handle.client


def test_predict_scores_logs_without_the_label_column(run: dict[str, Any], client: Any) -> None:
    """Criteo's test format: the training format less its first column, the label. It used
    to fail ('none of its rows parses ... wrong_column_count')."""
    s, tmp = run["servable"], run["tmp"] / "unlabelled"
    tmp.mkdir()
    src = Path(run["holdout"][0])
    lines = src.read_bytes().splitlines(keepends=True)
    labelled, unlabelled = tmp / "a-labelled.tsv", tmp / "b-test.tsv"
    labelled.write_bytes(b"".join(lines))
    unlabelled.write_bytes(b"".join(ln.split(b"\t", 1)[1] for ln in lines))
    assert unlabelled.read_text().splitlines()[0].count("\t") == 38  # 39 columns
    out = tmp / "pred"
    res = predict(s, [str(tmp)], out, client=client)
    got = _read_out(out)
    p_lab = got.loc[got["file"] == str(labelled), "probability"].to_numpy()
    p_unl = got.loc[got["file"] == str(unlabelled), "probability"].to_numpy()
    assert len(p_unl) == len(p_lab) == len(lines) and res.rows == 2 * len(lines)
    assert np.array_equal(p_unl, p_lab)
    assert np.abs(p_unl - run["reference"][: len(lines)]).max() < 1e-6
    assert res.unlabelled == [str(unlabelled)] and res.skipped == {}
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["files_without_labels"] == [str(unlabelled)]
    # told the logs are labelled, it says which file, and what to pass instead
    with pytest.raises(DataError) as e:
        predict(s, [str(unlabelled)], out, client=client, overwrite=True, labels="present")
    msg = str(e.value)
    assert str(unlabelled) in msg and "--labels auto" in msg and "\n" not in msg
    # --labels absent scores them alike
    res = predict(s, [str(unlabelled)], out, client=client, overwrite=True, labels="absent")
    assert np.array_equal(_read_out(out)["probability"].to_numpy(), p_unl)


def test_predict_skips_undecodable_lines_and_keeps_a_truncated_files_rows(
    run: dict[str, Any], client: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """One line that is not UTF-8 aborted the whole job ('CSV parse error: Row #...');
    a truncated .gz file was lost whole."""
    s, tmp = run["servable"], run["tmp"] / "damaged"
    tmp.mkdir()
    src = Path(run["holdout"][0])
    lines = src.read_bytes().splitlines(keepends=True)
    bad = [
        *lines[:2],
        b"\x89PNG\xff\xfe junk \x00\x01\n",
        lines[2],
        lines[3].replace(b"\t", b"\t\xe9", 1),
        *lines[4:],
    ]
    (tmp / "a.tsv").write_bytes(b"".join(bad))
    whole = gzip.compress(b"".join(lines))
    (tmp / "b.tsv.gz").write_bytes(whole[: len(whole) // 2])
    capfd.readouterr()
    out = tmp / "pred"
    res = predict(s, [str(tmp)], out, client=client)
    assert res.skipped == {"undecodable": 2, "truncated_file": 1}
    got = _read_out(out)
    a = got.loc[got["file"] == str(tmp / "a.tsv"), "probability"].to_numpy()
    keep = [i for i in range(len(lines)) if i != 3]  # line 4 got a latin-1 byte
    assert np.abs(a - run["reference"][keep]).max() < 1e-6
    b = got.loc[got["file"] == str(tmp / "b.tsv.gz"), "probability"].to_numpy()
    assert 0 < len(b) < len(lines)
    assert np.abs(b - run["reference"][: len(b)]).max() < 1e-6
    _, err = capfd.readouterr()
    assert "Traceback" not in err and "PNG" not in err, err


def test_export_reproduces_predictions_outside_daskhps(
    run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    s, frame = run["servable"], run["frame"]
    out = run["tmp"] / "export"
    res = export_model(s, out)
    meta = json.loads((out / META).read_text())
    with pytest.warns(DeprecationWarning):  # torch.jit is deprecated, still what runtimes load
        model = torch.jit.load(str(out / MODEL))
    keys, emb = np.load(out / KEYS), np.load(out / EMBEDDINGS)
    assert res.keys == len(keys) == meta["keys"] > 0 and emb.shape == (len(keys), res.sparse_dim)
    # look every example's keys up in the dump; unseen keys by the recorded init rule
    order = np.argsort(keys)
    schema = s.config.data.schema
    k = frame[meta["inputs"]["sparse"]["fields"]].to_numpy(np.int64).reshape(-1)
    pos = np.minimum(np.searchsorted(keys[order], k), len(keys) - 1)
    hit = keys[order][pos] == k
    rows = np.empty((len(k), res.sparse_dim), dtype=np.float32)
    rows[hit] = emb[order][pos[hit]]
    init = meta["unseen_keys"]
    rows[~hit] = init_embedding(
        torch.from_numpy(k[~hit]), seed=init["seed"], dim=init["dim"], scale=init["scale"]
    ).numpy()
    assert hit.any() and (~hit).any()
    dense = torch.from_numpy(frame[list(schema.dense_names)].to_numpy(np.float32).copy())
    sparse = torch.from_numpy(rows).view(len(frame), len(schema.categorical_names), -1)
    with torch.no_grad():
        prob = torch.sigmoid(model(dense, sparse)).numpy()
    assert np.abs(prob - run["reference"]).max() < 1e-6
    # a second export into the same folder is refused with one clear line
    assert main(["export", "--model", str(run["cfg"].run.dir), "--out", str(out)]) == 1
    assert "already holds an export" in capsys.readouterr().err


def test_export_json_alone_serves_raw_log_rows(run: dict[str, Any]) -> None:
    """A serving stack written from export.json alone (tests/serve/standalone.py: no daskhps
    import) turns the raw holdout lines into keys, dense values and rows, and the TorchScript
    model gives daskhps's predictions."""
    s, frame = run["servable"], run["frame"]
    out = run["tmp"] / "export-standalone"
    export_model(s, out)
    meta = json.loads((out / META).read_text())
    lines = [line for f in run["holdout"] for line in Path(f).read_text().splitlines()]
    assert len(lines) == len(frame)  # no bad rows: raw line i is frame row i
    n = 300  # a pure-Python hash: enough rows to meet missing cells and unseen keys
    inputs = standalone.Inputs(meta)
    rows = inputs.cells(lines[:n])
    keys, dense = inputs.keys(rows), inputs.dense(rows)
    schema = s.config.data.schema
    assert np.array_equal(keys, frame[list(schema.categorical_names)].to_numpy(np.int64)[:n])
    assert np.array_equal(dense, frame[list(schema.dense_names)].to_numpy(np.float32)[:n])
    seen = np.isin(keys, np.load(out / meta["files"]["keys"]))
    assert seen.any() and not seen.all()  # both dumped rows and initial rows are used
    sparse = standalone.sparse_input(out, meta, keys)
    with pytest.warns(DeprecationWarning):
        model = torch.jit.load(str(out / meta["files"]["model"]))
    with torch.no_grad():
        logits = model(torch.from_numpy(dense), torch.from_numpy(sparse)).numpy()
    prob = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    assert np.abs(prob - run["reference"][:n]).max() < 1e-6


def test_refresh_from_one_checkpoint_of_the_run_to_the_next(run: dict[str, Any]) -> None:
    ckpts = list_checkpoints(run["cfg"].run.dir)
    assert [c.passes_done for c in ckpts] == [1, 2]
    older, newer = (Servable.from_checkpoint(c) for c in ckpts[-2:])
    stores = ShardedStores(newer.table)
    stored = torch.cat([s.keys() for s in stores.stores])
    stores.close()
    with ServingLookup(older.table, device_rows=len(stored) + 10, full_rows=True) as lk:
        lk.lookup(stored)  # every key cached at the older version
        report = lk.refresh(newer.table)
        got = lk.lookup(stored)
    assert np.array_equal(bits(got), bits(reference_rows(newer.table, stored)))
    assert report.how == "replay", report  # the next checkpoint extends the previous one
    assert 0 < report.rows_read == report.replaced_rows <= report.changed_keys < len(stored)


def test_a_retraining_runs_published_version_is_a_model(run: dict[str, Any]) -> None:
    """``--model <retraining run dir>`` serves the version its registry names current."""
    ckpt = latest_checkpoint(run["cfg"].run.dir)
    assert ckpt is not None
    versions = run["tmp"] / "retrain" / "versions"
    publish_checkpoint(Registry(versions), "v000001", ckpt)
    s = load_servable(versions.parent)
    assert (s.name, s.table.commit) == ("v000001", "version-v000001")
    scorer = Scorer(s, CacheSizes(device_rows=1000, host_bytes=0))
    try:
        prob = scorer.score(run["frame"])
    finally:
        scorer.close()
    assert np.abs(prob - run["reference"]).max() < 1e-6


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_unwritable_out_is_one_line_naming_it(
    run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before a worker starts or a model is traced: not a bare errno."""
    run_dir = str(run["cfg"].run.dir)
    (run["tmp"] / "afile").write_text("x")
    for out in ("/proc/daskhps-x", str(run["tmp"] / "afile" / "sub")):
        data = ["--data", run["holdout"][0]]
        for argv, what in (
            (["predict", "--model", run_dir, *data, "--out", out], "predictions"),
            (["export", "--model", run_dir, "--out", out], "the export"),
        ):
            assert main(argv) == 1
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "Errno" not in err, err
            assert err.startswith(f"daskhps {argv[0]}: error: cannot write {what} to {out}: ")
            assert err.rstrip().endswith("; choose a writable --out"), err

"""The benchmark scripts run end to end at small sizes and follow the ``--json`` convention.

These are smoke runs that keep the scripts from rotting; the figures come from full runs
(see docs/benchmarks.md), never from assertions on time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._clusters import WORKER_MEMORY
from tests._scripts import SCRIPTS, run_script


@pytest.mark.slow
def test_bench_table_quick() -> None:
    recs = run_script("bench_table.py", "--quick")
    names = " ".join(r["name"] for r in recs)
    for part in ("device lookup hits", "insert+evict", "zarr tier read", "table.stage", "zipf"):
        assert part in names
    zipf = [r for r in recs if r["name"].startswith("zipf")]
    assert len(zipf) == 3
    for r in zipf:
        rates = r["device_hit"] + r["host_hit"] + r["zarr_hit"] + r["init"]
        assert rates == pytest.approx(1.0, abs=1e-3)


@pytest.mark.slow
def test_bench_pipeline_quick(tmp_path: Path) -> None:
    recs = run_script(
        "bench_pipeline.py",
        "--rows",
        "20000",
        "--parts",
        "2",
        "--repeat",
        "1",
        "--out",
        str(tmp_path / "logs"),
    )
    assert any("read_csv" in (r.get("baseline_name") or r["name"]) for r in recs)


@pytest.mark.slow
def test_bench_placement_quick(tmp_path: Path) -> None:
    recs = run_script(
        "bench_placement.py", "--rows", "20000", "--parts", "2", "--repeat", "1",
        "--out", str(tmp_path / "logs"),
    )  # fmt: skip
    assert ["p2p shuffle" in recs[0]["name"], "tasks shuffle" in recs[1]["name"]] == [True, True]
    # A tasks shuffle's pieces cross between the workers in both placements, so both fetched
    # bytes. Which fetches less depends on where the scheduler put the pieces (docs/pipeline.md:
    # one hop moves the keys before their global dedup); that partitions never move after a
    # tasks shuffle is checked with the transfer logs in tests/passes/test_placement.py.
    assert recs[1]["fetched_mib"] > 0 and recs[1]["baseline_fetched_mib"] > 0


@pytest.mark.slow
def test_bench_train_quick() -> None:
    recs = run_script("bench_train.py", "--quick")
    vs_torch = [r for r in recs if r["name"].startswith("daskhps train step")]
    assert len(vs_torch) == 1 and vs_torch[0]["unit"] == "examples/s"
    assert "plain PyTorch" in vs_torch[0]["baseline_name"]
    ooc = [r for r in recs if "x its host tier" in r["name"]]
    assert len(ooc) == 1
    assert sum(ooc[0]["hit_rate"].values()) == pytest.approx(1.0, abs=1e-3)
    assert ooc[0]["stage_from"]["from_store"] > 0  # rows really went through the zarr tier
    names = " ".join(r["name"] for r in recs)
    for stage in ("stage", "pull", "forward_backward", "push", "dense_step", "flush"):
        assert f"out-of-core run: {stage} per pass" in names


@pytest.mark.slow
def test_bench_serve_quick() -> None:
    recs = run_script("bench_serve.py", "--quick")
    by_start = {r["name"].split(" (")[0]: r for r in recs}
    thrash = next(r for r in recs if "thrashing batches" in r["name"])
    assert thrash["unit"] == "keys/s" and "device cache" in thrash["baseline_name"]
    assert thrash["store_rows_read"] == thrash["rows_from"]["store"] > 0
    warm = next(r for r in recs if r["name"].endswith("every row in the device cache"))
    assert "index_select" in warm["baseline_name"]
    replay = by_start["refresh, replay"]
    assert replay["unit"] == "ms" and "re-warm" in replay["baseline_name"]
    # every changed key was cached, so a refresh reads exactly those rows
    assert replay["replaced_rows"] == replay["rows_read"] > 0
    assert replay["rewarm_rows_read"] == thrash["store_rows_read"]
    rollback = next(r for r in recs if r["name"].startswith("refresh, rollback"))
    assert rollback["baseline_name"] == "refresh, replay"


@pytest.mark.slow
def test_bench_metrics_quick() -> None:
    recs = run_script("bench_metrics.py", "--quick")
    hooks = [r for r in recs if r.get("baseline_name", "").startswith("EmbeddingTable.stats()")]
    names = " ".join(r["name"] for r in hooks)
    for part in ("stage_span", "Workers-table callback", "refresh", "/metrics collection"):
        assert part in names
    assert all(r["unit"] == "us" and r["value"] > 0 for r in hooks)
    shard = {r["name"]: r["value"] for r in recs if r["name"].startswith("shard: ")}
    assert shard["shard: device tier rows"] == 20_000
    assert shard["shard: zarr store rows"] > 0  # the passes pushed rows down to the store


@pytest.mark.slow
def test_bench_checkpoint_quick() -> None:
    recs = run_script("bench_checkpoint.py", "--quick")
    deltas = [r for r in recs if r["name"].endswith("bytes added")]
    assert len(deltas) == 2  # 100 and 1,000 touched rows of the quick table
    for r in deltas:
        assert r["value"] >= r["touched_row_kib"]  # the touched rows are in the delta
        assert r["ratio"] < 0.1  # and the delta is a small part of the whole table
    copies = [r for r in recs if "copied to checkpoint.replicate_to" in r["name"]]
    assert len(copies) == 3  # the base and each delta
    base_kib = recs[0]["value"] * 2**10
    assert copies[0]["copied_kib"] >= base_kib * 0.99  # the base's copy: the whole store
    for copy, delta in zip(copies[1:], deltas, strict=True):
        assert copy["copied_kib"] == pytest.approx(delta["value"], abs=0.1)  # what it added


@pytest.mark.slow
def test_bench_reshard_quick() -> None:
    recs = {r["name"]: r for r in run_script("bench_reshard.py", "--quick")}
    copy = recs["copy of the stores' files (the baseline)"]
    for workers in (1, 3):
        r = recs[f"re-shard from 2 workers to {workers}"]
        assert r["unit"] == "rows/s" and r["value"] > 0 and r["baseline"] == copy["value"]
        assert r["at_scale_s"] > 0
    for workers in (2, 4):  # the 3 rank stores onto 2 and 4: in one process, on the workers
        one = recs[f"re-shard from 3 workers to {workers}, in one process"]
        r = recs[f"re-shard from 3 workers to {workers}, on {workers} workers"]
        assert len(one["runs_s"]) == len(r["runs_s"]) == 1 and r["baseline"] == one["value"]
        assert r["rows_moved"] > 0 and r["moved_mib"] >= r["min_mib"] > 0


@pytest.mark.slow
def test_bench_import_quick() -> None:
    (rec,) = run_script("bench_import.py", "--quick")
    assert rec["unit"] == "rows/s" and rec["value"] > 0
    assert "np.save" in rec["baseline_name"]
    # 50,000 rows x (64 + 64) floats, each rank's keys and index snapshot beside them
    assert rec["store_bytes"] >= 50_000 * 128 * 4


@pytest.mark.slow
def test_bench_scale_quick(tmp_path: Path) -> None:
    """Every stage at a toy size on one worker: the table of cold keys around the logs' keys
    trains the same model as the table of the logs' keys only, and the run killed mid-pass
    resumes to the uninterrupted run's rows and weights."""
    recs = run_script(
        "bench_scale.py",
        "--out",
        str(tmp_path),
        "--rows",
        "40000",
        "--log-rows",
        "5000",
        "--workers",
        "1",
        "--memory-limit",
        WORKER_MEMORY,
        timeout=600,
    )
    by_name = {r["name"].split(",")[0]: r for r in recs}
    train = by_name["train examples/s"]
    assert train["same_model_as_baseline"] is True
    assert train["memory_problems"] == 0 and train["peak_over_limit"] < 0.8
    assert train["staged_from"]["store"] > 0  # the passes read rows back from the store
    assert by_name[next(n for n in by_name if n.startswith("killed"))]["value"] == 1.0
    stores = [r for r in recs if r["name"].startswith("store of")]
    assert len(stores) == 3 and all(r["delta_commit_s"] > 0 for r in stores)
    assert (tmp_path / "scale-costs.svg").stat().st_size > 0
    assert not (tmp_path / "runs").exists()  # what it wrote is removed, the figures kept


@pytest.mark.slow
def test_bench_sizing_quick(tmp_path: Path) -> None:
    """A small day through ``plan`` and ``train``: both workers sampled, the plan's parts
    reported, and the peak at most 20% over the plan. The plan prices full tiers; tiers are
    reserved, not written, so a day far smaller than its tiers peaks well under the plan
    (about 0.74 here); filled tiers are held to 20% both ways by test_memory_growth."""
    (rec,) = run_script(
        "bench_sizing.py", "--out", str(tmp_path), "--cases", "day", "--day-rows", "20000"
    )
    assert rec["unit"] == "MiB" and len(rec["worker_peaks_mib"]) == 2
    parts = rec["plan_parts_mib"]
    assert set(parts) == {"process", "tiers", "dense", "examples", "transient"}
    assert parts["tiers"] > 0 and parts["transient"] > 0
    assert 0.3 <= rec["ratio"] <= 1.2, rec
    assert rec["memory_problems"] == []
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()


@pytest.mark.slow
def test_bench_online_quick(tmp_path: Path) -> None:
    recs = run_script("bench_online.py", "--quick", "--rows", "17000", "--out", str(tmp_path))
    by_name = {r["name"]: r for r in recs}
    for b in (1, 64, 1024, 4096):  # the quick run's largest batch is 4096
        r = by_name[f"serve p50, batch {b}"]
        assert r["unit"] == "ms" and r["baseline_name"] == "floor p50" and r["requests"] > 0
        assert r["in_process_ms"] > 0
    # the floor scores the same rows as the server
    assert by_name["floor vs serve: max |p difference|, batch 64"]["value"] < 1e-5
    assert sum(1 for n in by_name if n.startswith("QPS batch 64")) == 6
    assert by_name["refresh under load: failed requests"]["value"] == 0  # the invariant
    assert by_name["refresh under load: publish to first v000002 answer"]["value"] > 0


@pytest.mark.slow
def test_bench_gpu_quick_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "figures.jsonl"
    recs = run_script("bench_gpu.py", "--quick", "--device", "cpu", "--out", str(out))
    names = [r["name"] for r in recs]
    assert any("device lookup hits" in n for n in names)
    assert any("insert+evict" in n for n in names)
    assert any("training pass" in n for n in names)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == recs  # the file holds what was printed


@pytest.mark.slow
def test_bench_index_probe_quick() -> None:
    recs = run_script("bench_index_probe.py", "--quick", "--repeat", "3")
    names = " ".join(r["name"] for r in recs)
    for part in ("DeviceCache.lookup as shipped", "index probe alone", "khash", "inside a lookup"):
        assert part in names


@pytest.mark.parametrize(
    ("device", "says"),
    [("gpu0", "is not a torch device; use cuda, cuda:N or cpu"), ("cuda", "no CUDA device")],
)
def test_bench_gpu_refuses_a_device_it_cannot_use_in_one_line(device: str, says: str) -> None:
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    res = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_gpu.py"), "--device", device],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 2
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], res.stdout + res.stderr
    assert not res.stderr.strip()  # no traceback


@pytest.mark.slow
def test_bench_lifecycle_quick(tmp_path: Path) -> None:
    """One retraining day of each configuration: the figures and the plot are there, and the
    bounded table is the smaller one."""
    sizes = ["--days", "1", "--rows-per-day", "2000", "--workers", "1"]
    recs = run_script("bench_lifecycle.py", "--out", str(tmp_path), *sizes, timeout=600)
    by_name = {r["name"].split(",")[0]: r for r in recs}
    assert 0 < by_name["last-day table rows"]["ratio"] < 1
    assert abs(by_name["last-day AUC"]["value"]) < 0.5
    assert (tmp_path / "lifecycle.svg").read_text().count("<polyline") == 6
    days = json.loads((tmp_path / "lifecycle.json").read_text())["days"]
    assert days["bounded"][0]["pending_keys"] > 0 == days["unbounded"][0]["pending_keys"]


@pytest.mark.slow
def test_bench_network_quick() -> None:
    """A small day on two workers: every kind measured against the least its pass needs
    (never below it), and the projection for each host count and link."""
    recs = run_script("bench_network.py", "--rows", "20000", "--pass-rows", "10000")
    by_name = {r["name"]: r for r in recs}
    for kind in ("keys", "rows", "grads", "dense", "pass_keys", "examples", "total"):
        rec = by_name[f"bytes a pass, busiest host: {kind}"]
        assert rec["unit"] == "B" and rec["value"] > 0 and rec["ratio"] >= 1.0, rec
    projected = [r for r in recs if r["name"].startswith("network seconds a pass")]
    assert len(projected) == 6 and all(r["value"] > 0 and r["host_bytes"] > 0 for r in projected)


@pytest.mark.slow
def test_bench_object_store_quick(tmp_path: Path) -> None:
    """A small day read from moto's S3 server and from disk, without the training runs: the
    same rows both ways, the bytes fetched counted, and the figures written as JSON."""
    pytest.importorskip("s3fs", reason="the object-storage benchmark needs s3fs")
    pytest.importorskip("moto.server", reason="the object-storage benchmark needs moto[server]")
    out = tmp_path / "figures.json"
    args = ["--quick", "--no-train", "--s3-block-size", "0", "--results", str(out)]
    recs = run_script("bench_object_store.py", *args)
    reads = [r for r in recs if r["name"].startswith("read a ")]
    assert len(reads) == 2 and all(r["unit"] == "rows/s" and r["value"] > 0 for r in reads)
    fetched = {r["name"]: r for r in recs if r["name"].startswith("bytes fetched")}
    whole = fetched["bytes fetched from the S3 server over the log's bytes, whole files"]
    assert whole["fetched_bytes"] == whole["log_bytes"]  # a whole object: one GET of it
    assert whole["get_requests"] == 8
    assert all(r["value"] >= 1.0 for r in fetched.values())
    figures = json.loads(out.read_text())
    assert figures["raw_get"]["get_1_mb_s"] > 0 and "train" not in figures


@pytest.mark.slow
def test_peer_torch_learns_a_small_day(tmp_path: Path) -> None:
    """The plain PyTorch peer of ``bench_peers.py`` alone, on two generated days of 20,000
    rows in batches of 512 on one thread (two wait on each other on a busy machine): it learns
    (the generator's signal is there to find) and prints the fields the benchmark reads. The
    whole benchmark trains daskhps twice a round: too long to run here."""
    from daskhps.data.synthetic import GeneratorConfig, generate

    cfg = GeneratorConfig(days=2, rows_per_day=20_000, parts_per_day=2, vocab_scale=0.1)
    generate(cfg, tmp_path, scheduler="sync")
    res = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "peer_torch.py"),
            "--train", str(tmp_path / "day=2024-01-01"),
            "--holdout", str(tmp_path / "day=2024-01-02"),
            "--batch", "512", "--threads", "1",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["auc"] > 0.55, out
    assert out["examples"] == out["holdout_examples"] == 20_000
    assert out["batches"] == 40
    assert 0 < out["time_to_first_step_s"] < out["wall_s"]
    assert out["examples_per_s"] > 0 and out["first_step_at"] > 0


@pytest.mark.parametrize("schema", ["criteo", "avazu"])
def test_the_real_log_peers_split_in_time_order_and_learn(tmp_path: Path, schema: str) -> None:
    """``bench_quality.py --real``'s split and peers (scripts/_real_logs.py, peer_real.py) on a
    look-alike of each public sample (the samples' terms forbid committing them): generated
    rows with a planted signal, written in the sample's format, 80% then 20% in file order."""
    sys.path.insert(0, str(SCRIPTS))
    import _real_logs as real

    from daskhps.data.synthetic import GeneratorConfig, generate

    generate(GeneratorConfig(days=1, rows_per_day=3000, parts_per_day=1, vocab_scale=0.01),
             tmp_path / "gen", scheduler="sync")  # fmt: skip
    rows = [
        line.split("\t")
        for line in next((tmp_path / "gen").glob("day=*/part-*")).read_text().splitlines()
    ]
    if schema == "criteo":
        text = "".join("\t".join(r) + "\n" for r in rows)
    else:  # Avazu's CSV: id, click, then categorical columns (Criteo's C1..C22 here)
        head = "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
        head += "app_category,device_id,device_ip,device_model,device_type,device_conn_type,"
        head += ",".join(f"C{i}" for i in range(14, 22))
        text = (
            head
            + "\n"
            + "".join(",".join([str(i), r[0], *r[14:36]]) + "\n" for i, r in enumerate(rows))
        )
    sample = tmp_path / f"sample.{real.SOURCES[schema]['ext']}"
    sample.write_text(text)
    train, holdout, n_train, n_held = real.split(schema, sample, tmp_path / "logs")
    assert (n_train, n_held) == (2400, 600)
    body = text.splitlines(keepends=True)[1 if schema == "avazu" else 0 :]
    head_line = text.splitlines(keepends=True)[:1] if schema == "avazu" else []
    assert train.read_text() == "".join(head_line + body[:2400])  # the first 80%, in order
    assert holdout.read_text() == "".join(head_line + body[2400:])
    assert train.parent.name == "day=2024-01-01" and holdout.parent.name == "day=2024-01-02"
    cfg = real.daskhps_config(schema, tmp_path / "logs", tmp_path / "run", 0, n_train)
    assert cfg.table.optimizer.lr == 0.05 and cfg.passes.plan.global_batch_size == real.BATCH
    out = real.peers(schema, train, holdout, seed=0)
    for peer in real.PEERS:
        epochs = out[peer]["epochs"]
        assert len(epochs) == real.EPOCHS and out[peer]["train_rows"] == 2400
        assert out[peer]["auc"] == max(e["auc"] for e in epochs), out[peer]
    # Adagrad at 0.05 finds the planted signal in 2,400 rows; Adam at 0.001 moves slowly
    assert out["adagrad"]["auc"] > 0.55 and out["adam"]["auc"] > 0.5, out


@pytest.mark.slow
def test_bench_tables_quick(tmp_path: Path) -> None:
    """One dim for every field against a dim for each field by its vocabulary, a tiny day
    through ``daskhps train`` on 2 workers: every figure reported against the one-dim run, the
    narrower fields' rows in their own tables, fewer bytes of rows, and the figures written."""
    recs = run_script(
        "bench_tables.py", "--quick", "--variants", "one-64,per-field", "--out", str(tmp_path)
    )
    by_name = {r["name"]: r for r in recs}
    assert len(recs) == 2 * 6 and all(r["baseline_name"] == "one-64" for r in recs)
    table = by_name["table bytes (rows x row bytes), per-field"]
    assert table["tables"] == {"dim4": 4, "dim8": 8, "dim16": 16, "dim32": 32, "embeddings": 64}
    assert table["rows"] == by_name["table bytes (rows x row bytes), one-64"]["rows"] > 0
    for figure in ("table bytes (rows x row bytes)", "exchange bytes per example (rows + grads)"):
        assert 0 < by_name[f"{figure}, per-field"]["ratio"] < 1
    assert 0 < by_name["holdout AUC, per-field"]["value"] < 1
    saved = json.loads((tmp_path / "bench_tables.json").read_text())
    assert set(saved["variants"]) == {"one-64", "per-field"}
    assert not (tmp_path / "runs").exists()  # the runs are removed, the logs and figures kept


@pytest.mark.slow
def test_bench_worker_reuse_quick() -> None:
    """Three runs on one real worker: its RSS is read after each, and the figure says how it
    moved from the first run to the last."""
    (rec,) = run_script("bench_worker_reuse.py", "--runs", "3", "--workers", "1", "--rows", "4000")
    assert rec["unit"] == "MiB" and len(rec["rss_mib"]) == 3
    assert rec["value"] == pytest.approx(rec["rss_mib"][-1], abs=0.1)
    assert rec["baseline"] == pytest.approx(rec["rss_mib"][0], abs=0.1)
    assert rec["memory_problems"] == 0 and "slope_mib_per_run" in rec


@pytest.mark.slow
def test_bench_hosts_quick(tmp_path: Path) -> None:
    """Two cgroup-limited hosts on private disks, a small day: every figure is reported, no
    host is killed by the kernel, and the host lost with its disk comes back from the copy to
    the uninterrupted run's model."""
    from tests._cgroups import cgroups_unavailable
    from tests._hosts import namespaces_unavailable

    why = namespaces_unavailable() or cgroups_unavailable()
    if why is not None:
        pytest.skip(why)
    recs = run_script(
        "bench_hosts.py",
        *("--out", str(tmp_path), "--hosts", "2", "--rows", "12000", "--checkpoint-every", "1"),
        timeout=900,
    )
    by_name = {r["name"].split(",")[0].split(" (")[0]: r for r in recs}
    speed = next(r for n, r in by_name.items() if n.startswith("training examples/s"))
    assert speed["value"] > 0 and speed["baseline"] > 0
    for stage in ("fits", "spills"):
        peak = by_name[f"{stage}: the busiest host's peak RSS vs daskhps plan's peak per worker"]
        assert peak["oom_kills"] == [0, 0] and 0 < peak["value"] < peak["host_memory_mib"]
    lost = by_name["a host lost with its disk: seconds from the loss to training again"]
    assert lost["same_model_as_spills"] is True and lost["restored_bytes"] > 0
    assert lost["value"] >= lost["waited_for_a_host_s"] >= 0
    assert (tmp_path / "results.json").exists()


@pytest.mark.slow
def test_bench_follow_quick() -> None:
    """A follower and a server as a user starts them; a chunk renamed into the watched folder
    is served within the issue's minute, and the soak's figures are reported."""
    recs = run_script("bench_follow.py", "--chunks", "2", "--rows", "2000", timeout=600)
    by_name = {r["name"]: r for r in recs}
    median = by_name["follow.freshness.median"]
    assert 0 < median["value"] < median["goal_s"] and median["chunks"] == 2
    assert by_name["follow.freshness.part-00002.tsv"]["version"] == "v000003"
    for figure in ("follow.memory.driver.2", "follow.memory.workers.2", "follow.disk.2"):
        assert by_name[figure]["value"] > 0 and by_name[figure]["baseline"] > 0


def test_bench_models_quick() -> None:
    recs = run_script("bench_models.py", "--quick")
    shipped = [r for r in recs if r["name"].endswith("interaction as shipped")]
    assert [r["name"].split(",")[1].strip() for r in shipped] == ["dim 16", "dim 32", "dim 64"]
    assert all(r["unit"] == "ms" and r["value"] > 0 and r["baseline"] > 0 for r in recs)
    (per_field,) = [r for r in recs if "per-field" in r["name"]]
    assert per_field["baseline_name"] == "every field at dim 64"
    assert len(per_field["dims"]) == 26 and max(per_field["dims"]) == 64

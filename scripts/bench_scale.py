"""Benchmark a table larger than the machine's RAM, end to end on one box: training examples/s
with it against a table holding only the keys the logs touch, the same logs, model and batches;
a kill mid-pass that resumes to the same model; and the store's costs at three table sizes.

    python scripts/bench_scale.py [--json] [--out DIR] [--times-ram 1.5 | --rows N]
                                  [--log-rows N] [--memory-limit 6GiB] [--stages S,...] [--keep]

Everything goes through the product: ``daskhps import`` builds each table from an ``.npy``
pair, ``daskhps train --resume`` trains on it (a LocalCluster of ``--workers`` worker
processes), ``DASKHPS_KILL_AT=mid_pass:2`` kills the driver mid-pass. The stages, in order
(``--stages`` picks some; a stage whose result is in ``OUT/results.json`` is skipped, so a
stopped benchmark resumes stage by stage)::

    logs      generate a day of Criteo-format logs; collect the keys they use (the hot keys)
              and give each a row, a function of the key
    small     import a table of the hot keys only; train on it (the baseline)
    costs     for each smaller size (--rows / 100 and / 10): import a table of that many rows
              (the hot keys among them) and probe one rank's store
    big       import the large table (the hot keys plus cold keys up to --rows); train on it;
              digest every rank's rows and the dense weights; probe rank 0's store; remove it
    kill      import it again; train with the driver SIGKILLed in the middle of the third
              pass; resume; digest and compare with ``big``; remove it
    report    print the figures; write OUT/scale-costs.svg (the costs against rows, log-log)

The probe (one rank's store, at the sizes of ``costs`` and at the large size after training)
times opening the store and measures the resident memory it adds per row, ``stats()``, a
staging read of 100,000 random stored keys, a delta commit of 100,000 changed rows, then
makes about a tenth of the rows stale in whole segments and times ``compact()`` and the base
commit that follows it (what a base checkpoint does), with the bytes on disk over the live
rows' bytes before and after.

A thread samples the resident set size (RSS) of every process the training driver starts (its
Dask workers) every 20 ms; a worker paused, restarted or killed for memory is read from the
run's log. The disk holds one large table at a time: the input ``.npy`` pair (about a third of
the table) is kept until ``kill`` has imported it again. Everything is removed at the end
unless ``--keep``; the figures stay in ``OUT/results.json`` when ``--out`` is given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter, cli, plan, train

from daskhps.data.hashing import fmix64

DIM = 64
WIDTH = 3 * DIM + 1  # Adam: embedding, m, v, step
ROW_BYTES = 4 * WIDTH
KILL_AT = "mid_pass:2"  # the third pass: after a base and a delta checkpoint


# -- inputs ----------------------------------------------------------------------------------


def _u64(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint64) if x.dtype == np.int64 else x.astype(np.uint64)


def rows_of(keys: np.ndarray) -> np.ndarray:
    """Each key's starting embedding, a function of the key alone, so a key's row is the same
    in every table this benchmark builds: uniform in [-0.05, 0.05)."""
    k = _u64(keys)
    out = np.empty((keys.size, DIM), dtype=np.float32)
    for j in range(DIM):
        h = fmix64(k ^ np.uint64((j + 1) * 0x9E3779B97F4A7C15 % 2**64))
        out[:, j] = (h >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24) - 0.5
    out *= 0.1
    return out


def cold_keys(positions: np.ndarray) -> np.ndarray:
    """Distinct keys for row positions (fmix64 is a bijection), unlike the logs' hashes."""
    salted = fmix64(positions.astype(np.uint64) ^ np.uint64(0x5BD1E9955BD1E995))
    return fmix64(salted ^ np.uint64(0xC2B2AE3D27D4EB4F)).view(np.int64)


def write_input(folder: Path, rows: int, hot: np.ndarray, seed: int = 0) -> None:
    """``keys.npy`` and ``embeddings.npy`` of ``rows`` keys: the hot keys at random positions,
    cold keys elsewhere; written in chunks, never whole in memory."""
    if rows < hot.size:
        raise SystemExit(f"--rows {rows:,} is below the {hot.size:,} keys the logs use")
    folder.mkdir(parents=True, exist_ok=True)
    gen = np.random.default_rng(seed)
    where = np.sort(gen.choice(rows, hot.size, replace=False))
    order = hot[gen.permutation(hot.size)]
    hot_sorted = np.sort(hot)
    keys = np.lib.format.open_memmap(folder / "keys.npy", "w+", np.int64, (rows,))
    emb = np.lib.format.open_memmap(folder / "embeddings.npy", "w+", np.float32, (rows, DIM))
    step = 1 << 20
    for a in range(0, rows, step):
        b = min(rows, a + step)
        lo, hi = np.searchsorted(where, [a, b])
        k = cold_keys(np.arange(a, b))
        if np.isin(k, hot_sorted).any():
            raise SystemExit("a cold key equals a hot key; change --seed")
        r = (gen.random((b - a, DIM), dtype=np.float32) - 0.5) * np.float32(0.1)
        k[where[lo:hi] - a] = order[lo:hi]
        r[where[lo:hi] - a] = rows_of(order[lo:hi])
        keys[a:b] = k
        emb[a:b] = r
    keys.flush()
    emb.flush()
    del keys, emb


def hot_keys(logs: Path) -> np.ndarray:
    """Every key the logs use, as training hashes them."""
    import dask

    from daskhps.data.readers import read_click_log

    log = read_click_log(str(logs), block_size=None)
    fields = [c.name for c in log.schema.categorical]

    def keys_of(df: Any) -> np.ndarray:
        return np.unique(np.concatenate([df[f].to_numpy(dtype=np.int64) for f in fields]))

    parts = dask.compute(*[dask.delayed(keys_of)(p) for p in log.frame.to_delayed()])
    return np.unique(np.concatenate(parts))


# -- runs ------------------------------------------------------------------------------------


def run_config(
    out: Path, name: str, args: argparse.Namespace, pass_rows: int, device_rows: int
) -> Path:
    folder = out / "runs" / name
    folder.mkdir(parents=True, exist_ok=True)
    d = {
        "run": {"name": name, "dir": str(folder / "run"), "seed": 5, "quiet": True},
        "data": {"train": {"paths": [str(out / "logs")]}, "holdout": {"fraction": 0.01}},
        "passes": {
            "epochs": 1,
            "examples_per_pass": pass_rows,
            "global_batch_size": min(2048, pass_rows // 4),
        },
        "eval": {"batch_size": 8192},
        "table": {
            "dim": DIM,
            "optimizer": {"kind": "adam", "lr": 0.001},
            # The device tier holds two passes' working sets (the next pass is staged while
            # one trains) and the host tier little more: each pass stages the keys the
            # previous two did not use from the store.
            "tiers": {
                "device": {"rows": device_rows},
                "host": {"fraction": 0.01},
                "store_dir": str(folder / "stores"),
            },
        },
        "model": {"name": "dlrm", "options": {"bottom_mlp": [32, DIM], "top_mlp": [64]}},
        "dense_optimizer": {"kind": "adam", "lr": 0.001},
        # The import is the base; the first pass's checkpoint is a base too (a compaction
        # and an index snapshot of the whole table), the rest deltas.
        "checkpoint": {"every_passes": 1, "keep": 10, "full_every": 1000},
        "cluster": {
            "n_workers": args.workers,
            "threads_per_worker": 2,
            "memory_limit": args.memory_limit,
            "processes": True,
            "gpu": False,
            "dashboard_address": None,
            # Staging from a store larger than the page cache is disk-bound: a rank can read
            # for minutes while its peer waits in a collective (60 s by default).
            "dist_timeout_s": 900.0,
        },
    }
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def import_table(config: Path, folder: Path, log: Path) -> dict[str, Any]:
    """``daskhps import`` of the ``.npy`` pair in ``folder``: its wall seconds and rows/s."""
    start = log.stat().st_size if log.exists() else 0
    t0 = time.perf_counter()
    args = ["--keys", str(folder / "keys.npy"), "--rows", str(folder / "embeddings.npy")]
    rc = cli("import", str(config), *args, "--json", log=log).wait()
    seconds = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"daskhps import failed (exit {rc}); see {log}")
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    summary = json.loads(text[text.index("{") :])  # --json: the summary is all it prints
    return {
        "seconds": round(seconds, 1),
        "rows_per_s": round(summary["rows"] / seconds),
        "store_bytes": summary["bytes"],
    }


def pass_figures(run_dir: Path) -> dict[str, Any]:
    """Training examples/s (all passes' examples over their training seconds), the tier each
    staged row came from, the kept checkpoints' kinds and seconds, and the final evaluation."""
    from daskhps.runfiles.checkpoint import list_checkpoints

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    passes = [p for p in records if "restart" not in p]  # a restart has a line of its own
    staged: dict[str, int] = {}
    for p in passes:
        for k, v in p.get("staged_from", {}).items():
            staged[k] = staged.get(k, 0) + int(v)
    examples = sum(int(p["examples"]) for p in passes)
    seconds = sum(float(p["seconds"]["train"]) for p in passes)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "passes": len(passes),
        "examples": examples,
        "examples_per_s": round(examples / seconds, 1) if seconds else None,
        "staged_from": staged,
        "checkpoints": [
            {"name": c.name, "kind": c.kind, "seconds": c.seconds}
            for c in list_checkpoints(run_dir)
        ],
        "eval": summary.get("final_eval"),
    }


# -- digests ---------------------------------------------------------------------------------


def _row_hashes(keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each (key, row): a different value in any one word always changes it
    (each word is multiplied by an odd constant); vectorised over the rows."""
    words = rows.view(np.uint32).astype(np.uint64)
    mult = fmix64(np.arange(1, rows.shape[1] + 1, dtype=np.uint64)) | np.uint64(1)
    h = np.zeros(keys.size, dtype=np.uint64)
    for j in range(rows.shape[1]):
        h += words[:, j] * mult[j]
    return fmix64(h ^ fmix64(_u64(keys)))


def digest(run_dir: Path, hot: np.ndarray) -> dict[str, Any]:
    """A digest of every rank's rows (key order; read segment by segment, so in disk order),
    of the rows of the ``hot`` keys alone (the keys the logs use) and of the dense weights, at
    the run's latest checkpoint."""
    import torch

    from daskhps.runfiles.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None
    ranks, counts, hot_parts = [], [], []
    for r in range(ckpt.num_workers):
        store = ckpt.open_store(r)
        try:
            got_k, got_h = [], []
            ids = sorted(store.segment_ids)
            for a in range(0, len(ids), 4):
                k = store.segment_keys(set(ids[a : a + 4]))
                for b in range(0, k.shape[0], 1 << 18):
                    kk = k[b : b + (1 << 18)]
                    found = store.lookup(kk)
                    assert bool(found.found.all())
                    got_k.append(kk.numpy())
                    got_h.append(_row_hashes(kk.numpy(), found.rows.numpy()))
            keys = np.concatenate(got_k)
            hashes = np.concatenate(got_h)
            keys, first = np.unique(keys, return_index=True)
            if keys.size != len(store):
                raise SystemExit(f"rank {r}: read {keys.size} keys, the store holds {len(store)}")
            hashes = hashes[first]
            ranks.append(hashlib.sha256(keys.tobytes() + hashes.tobytes()).hexdigest())
            is_hot = np.isin(keys, hot)
            hot_parts.append((keys[is_hot], hashes[is_hot]))
            counts.append(int(keys.size))
        finally:
            store.close()
    dense = hashlib.sha256()
    for name, t in sorted(ckpt.dense_state().items()):
        dense.update(name.encode() + t.detach().to(torch.float32).numpy().tobytes())
    hk = np.concatenate([k for k, _ in hot_parts])
    hh = np.concatenate([h for _, h in hot_parts])
    order = np.argsort(hk)
    return {
        "checkpoint": ckpt.name,
        "hot": hashlib.sha256(hk[order].tobytes() + hh[order].tobytes()).hexdigest(),
        "ranks": ranks,
        "rows": counts,
        "dense": dense.hexdigest(),
    }


# -- the store probe ---------------------------------------------------------------------------


def probe(run_dir: Path) -> dict[str, Any]:
    """The costs of rank 0's store at the run's latest checkpoint (module docstring)."""
    import torch

    from daskhps.runfiles.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None
    me = psutil.Process()
    rss0 = me.memory_info().rss
    t0 = time.perf_counter()
    store = ckpt.open_store(0, mode="r+")
    open_s = time.perf_counter() - t0
    rss1 = me.memory_info().rss
    n = len(store)
    live_bytes = n * (8 + 4 * store.width)
    stats_times = []
    for _ in range(7):
        t0 = time.perf_counter()
        st = store.stats
        stats_times.append(time.perf_counter() - t0)
    index_bytes = st.extra["index_bytes"]
    gen = np.random.default_rng(1)
    all_keys = store.keys()
    pick = all_keys[torch.from_numpy(gen.choice(n, min(n, 100_000), replace=False))]
    t0 = time.perf_counter()
    for a in range(0, pick.shape[0], 25_000):
        store.lookup(pick[a : a + 25_000])
    stage_s = time.perf_counter() - t0
    rows = store.lookup(pick).rows
    store.upsert(pick, rows + 1e-3)
    t0 = time.perf_counter()
    store.commit("probe-delta")
    delta_s = time.perf_counter() - t0
    # Stale rows in whole segments (as many passes leave them): 60% of the rows of the
    # segments holding the first tenth of the table are written again.
    ids = sorted(store.segment_ids)
    chosen, held = [], 0
    for sid in ids:
        if held >= n // 10:
            break
        k = store.segment_keys({sid})
        chosen.append(sid)
        held += int(k.shape[0])
    stale = torch.unique(store.segment_keys(set(chosen)))
    stale = stale[torch.from_numpy(gen.random(stale.shape[0]) < 0.6)]
    for a in range(0, stale.shape[0], 65_536):
        k = stale[a : a + 65_536]
        store.upsert(k, store.lookup(k).rows)
    store.commit("probe-stale")
    amp_before = store.stats.extra["bytes_on_disk"] / live_bytes
    t0 = time.perf_counter()
    report = store.compact()
    compact_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.commit("probe-base")
    base_s = time.perf_counter() - t0
    store.drop_commits(keep=1)  # what checkpoint pruning does: free what compaction left
    amp_after = store.stats.extra["bytes_on_disk"] / live_bytes
    store.close()
    return {
        "rows": n,
        "open_s": round(open_s, 3),
        "ram_per_row": round((rss1 - rss0) / n, 1),
        "index_bytes_per_row": round(index_bytes / n, 1),
        "stats_s": round(statistics.median(stats_times), 5),
        "staging_rows_per_s": round(pick.shape[0] / stage_s),
        "delta_commit_s": round(delta_s, 3),
        "base_commit_s": round(base_s, 3),
        "compact_s": round(compact_s, 3),
        "compact_rows_moved": report.rows_moved,
        "disk_amp_before": round(amp_before, 3),
        "disk_amp_after": round(amp_after, 3),
        "segments": len(ids),
    }


def probe_in_subprocess(run_dir: Path) -> dict[str, Any]:
    """In a fresh process, so its resident memory is the store's alone."""
    out = subprocess.run(
        [sys.executable, __file__, "--probe", str(run_dir)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def progress(line: str) -> None:
    """Stage progress, on stderr (stdout holds the figures, JSON lines with ``--json``)."""
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


# -- stages ----------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, out: Path, rep: Reporter) -> None:
        self.args, self.out, self.rep = args, out, rep
        self.results_path = out / "results.json"
        self.results: dict[str, Any] = (
            json.loads(self.results_path.read_text()) if self.results_path.exists() else {}
        )
        self.log = out / "bench.log"

    def save(self, stage: str, result: dict[str, Any], seconds: float) -> None:
        self.results[stage] = {**result, "stage_seconds": round(seconds, 1)}
        self.results_path.write_text(json.dumps(self.results, indent=2))
        progress(f"{stage}: {json.dumps(self.results[stage])}")

    @property
    def pass_rows(self) -> int:
        return max(1_000, self.args.log_rows // 5)

    def clean(self, name: str) -> None:
        shutil.rmtree(self.out / "runs" / name, ignore_errors=True)

    def stage_logs(self) -> dict[str, Any]:
        from daskhps.data.synthetic import GeneratorConfig, generate

        shutil.rmtree(self.out / "logs", ignore_errors=True)
        generate(
            GeneratorConfig(
                rows_per_day=self.args.log_rows, parts_per_day=4, seed=11, vocab_scale=1.0
            ),
            self.out / "logs",
        )
        hot = hot_keys(self.out / "logs")
        np.save(self.out / "hot_keys.npy", hot)
        # The largest pass's keys per worker, counted by the trainer's own planning code.
        config = run_config(self.out, "plan", self.args, self.pass_rows, 1)
        scan = plan(config, "--scan")
        self.clean("plan")
        return {
            "log_rows": self.args.log_rows,
            "hot_keys": int(hot.size),
            "largest_pass_per_worker": scan["keys"]["largest_pass_per_owner"],
        }

    @property
    def device_rows(self) -> int:
        return int(2.2 * self.results["logs"]["largest_pass_per_worker"]) + 1000

    def hot(self) -> np.ndarray:
        return np.asarray(np.load(self.out / "hot_keys.npy"))

    def _table(
        self, name: str, rows: int, seed: int, hot: bool = True
    ) -> tuple[Path, dict[str, Any]]:
        """Import a table of ``rows`` rows (with the hot keys, or only cold ones) as run
        ``name``; the input pair is written once and reused while rows and seed match."""
        self.clean(name)
        config = run_config(self.out, name, self.args, self.pass_rows, self.device_rows)
        folder, made = self.out / "input", [rows, seed, hot]
        marker = folder / "done"
        if not marker.exists() or json.loads(marker.read_text()) != made:
            shutil.rmtree(folder, ignore_errors=True)
            t0 = time.perf_counter()
            write_input(folder, rows, self.hot() if hot else np.zeros(0, np.int64), seed)
            marker.write_text(json.dumps(made))
            progress(f"  input of {rows:,} rows written in {time.perf_counter() - t0:.0f} s")
        imp = import_table(config, folder, self.out / f"{name}.log")
        return config, imp

    def stage_small(self) -> dict[str, Any]:
        hot = self.hot()
        config, imp = self._table("small", hot.size, seed=1)
        run = train(config, self.out / "small.log", "--resume")
        result = {"import": imp, **run, **pass_figures(config.parent / "run")}
        result["digest"] = digest(config.parent / "run", self.hot())
        self.clean("small")
        return result

    def stage_costs(self) -> dict[str, Any]:
        out = {}
        for i, rows in enumerate(self.cost_sizes()[:-1]):
            config, imp = self._table(f"cost-{rows}", rows, seed=100 + i, hot=False)
            out[str(rows)] = {"import": imp, **probe_in_subprocess(config.parent / "run")}
            self.clean(f"cost-{rows}")
        return out

    def stage_big(self) -> dict[str, Any]:
        config, imp = self._table("big", self.args.rows, seed=7)
        report = plan(config)
        plan_figures = {
            "total": report["memory_per_worker"]["total"],
            "fits": report["fits"],
        }
        run = train(config, self.out / "big.log", "--resume")
        result = {"import": imp, "plan": plan_figures, **run, **pass_figures(config.parent / "run")}
        result["digest"] = digest(config.parent / "run", self.hot())
        result["probe"] = probe_in_subprocess(config.parent / "run")
        self.clean("big")
        return result

    def stage_kill(self) -> dict[str, Any]:
        config, imp = self._table("big", self.args.rows, seed=7)
        log = self.out / "kill.log"
        killed = train(config, log, "--resume", kill_at=KILL_AT)
        time.sleep(2)
        # Resuming also checks the killed driver's workers are gone: their store locks are.
        resumed = train(config, log, "--resume")
        result = {
            "import": imp,
            "killed": killed,
            "resumed": resumed,
            **pass_figures(config.parent / "run"),
        }
        result["digest"] = digest(config.parent / "run", self.hot())
        self.clean("big")
        if not self.args.keep:
            shutil.rmtree(self.out / "input", ignore_errors=True)
        return result

    def cost_sizes(self) -> list[int]:
        return [self.args.rows // 100, self.args.rows // 10, self.args.rows]

    def report(self) -> None:
        from dask.utils import format_bytes, parse_bytes

        r = self.results
        small, big, kill = r.get("small"), r.get("big"), r.get("kill")
        limit = parse_bytes(self.args.memory_limit)
        runs = [small, big] + ([kill["killed"], kill["resumed"]] if kill else [])
        runs = [x for x in runs if x]
        peak = max((max(x["peaks"]) for x in runs), default=0)
        problems = sum(len(x["memory_problems"]) for x in runs)
        if small and big:
            self.rep.emit(
                f"train examples/s, table of {self.args.rows:,} rows",
                big["examples_per_s"],
                "examples/s",
                baseline=small["examples_per_s"],
                baseline_name=f"a table of the {r['logs']['hot_keys']:,} keys the logs use",
                table=format_bytes(self.args.rows * ROW_BYTES),
                over_ram=round(self.args.rows * ROW_BYTES / psutil.virtual_memory().total, 2),
                peak_over_limit=round(peak / limit, 3),
                memory_problems=problems,
                staged_from=big["staged_from"],
                # Same logs, plan and starting rows: the keys the logs use end with the same
                # rows and the dense model with the same weights, whatever else the table holds.
                same_model_as_baseline=(
                    big["digest"]["hot"] == small["digest"]["hot"]
                    and big["digest"]["dense"] == small["digest"]["dense"]
                ),
                load=round(os.getloadavg()[0], 2),
            )
        if big and kill:
            same = big["digest"] == kill["digest"]
            self.rep.emit(
                f"killed at {KILL_AT}, resumed: rows and dense weights as uninterrupted",
                1.0 if same else 0.0,
                "(1: identical)",
                checkpoint=kill["digest"]["checkpoint"],
                rows=sum(kill["digest"]["rows"]),
            )
        sizes = {**(r.get("costs") or {})}
        if big:
            sizes[str(self.args.rows)] = {"import": big["import"], **big["probe"]}
        sizes.pop("stage_seconds", None)
        if not sizes:
            return
        ordered = sorted(sizes.values(), key=lambda c: int(c["rows"]))
        for c in ordered:
            self.rep.emit(
                f"store of {int(c['rows']):,} rows (one rank's)",
                c["open_s"],
                "s to open",
                **{k: v for k, v in c.items() if k not in ("rows", "open_s")},
            )
        if len(ordered) > 1:
            lo, hi = ordered[0], ordered[-1]
            grown = hi["ram_per_row"] * hi["rows"] - lo["ram_per_row"] * lo["rows"]
            self.rep.emit(
                "RAM per stored row, smallest to largest store",
                grown / (hi["rows"] - lo["rows"]),
                "bytes",
                baseline=hi["index_bytes_per_row"],
                baseline_name="the key index's own bytes per row",
            )
        plot(sizes, self.out / "scale-costs.svg")


# -- the log-log plot (no plotting library: a few SVG lines) ---------------------------------

_SERIES = (
    ("ram_per_row", "RAM per row (B)"),
    ("open_s", "open store (s)"),
    ("delta_commit_s", "delta commit (s)"),
    ("base_commit_s", "base commit (s)"),
    ("compact_s", "compact (s)"),
    ("disk_amp_before", "disk amplification"),
    ("staging_rows_per_s", "staging (rows/s)"),
    ("stats_s", "stats() (s)"),
)


def plot(sizes: dict[str, dict[str, Any]], path: Path) -> None:
    """One small log-log panel per cost against rows per rank store, with a dashed line of
    slope 1 through the first point (a cost that grows linearly follows it)."""
    w, h, pad = 220, 170, 36
    cols = 4
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * w}" '
        f'height="{math.ceil(len(_SERIES) / cols) * h}" font-family="sans-serif" '
        'font-size="11">'
    ]
    pts = sorted(((int(c["rows"]), c) for c in sizes.values()), key=lambda p: p[0])
    xs = [math.log10(p[0]) for p in pts]
    for i, (key, title) in enumerate(_SERIES):
        ox, oy = (i % cols) * w, (i // cols) * h
        ys = [math.log10(max(float(p[1][key]), 1e-9)) for p in pts]
        x0, x1 = min(xs) - 0.2, max(xs) + 0.2
        y0 = min(ys) - 0.3
        y1 = max([*ys, ys[0] + xs[-1] - xs[0]]) + 0.3

        def sx(x: float, ox: int = ox, x0: float = x0, x1: float = x1) -> float:
            return ox + pad + (x - x0) / (x1 - x0) * (w - pad - 10)

        def sy(y: float, oy: int = oy, y0: float = y0, y1: float = y1) -> float:
            return oy + h - pad + 10 - (y - y0) / (y1 - y0) * (h - pad - 20)

        out.append(f'<text x="{ox + pad}" y="{oy + 14}">{title}</text>')
        out.append(
            f'<rect x="{ox + pad}" y="{oy + 20}" width="{w - pad - 10}" '
            f'height="{h - pad - 10}" fill="none" stroke="#999"/>'
        )
        out.append(
            f'<line x1="{sx(xs[0]):.1f}" y1="{sy(ys[0]):.1f}" x2="{sx(xs[-1]):.1f}" '
            f'y2="{sy(ys[0] + xs[-1] - xs[0]):.1f}" stroke="#bbb" stroke-dasharray="4 3"/>'
        )
        line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys, strict=True))
        out.append(f'<polyline points="{line}" fill="none" stroke="#1f77b4"/>')
        for x, y, p in zip(xs, ys, pts, strict=True):
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="#1f77b4"/>')
            out.append(
                f'<text x="{sx(x) - 12:.1f}" y="{oy + h - 8}" font-size="9">{p[0]:.0e}</text>'
            )
            out.append(
                f'<text x="{sx(x) + 4:.1f}" y="{sy(y) - 4:.1f}" font-size="9">'
                f"{float(p[1][key]):.3g}</text>"
            )
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


STAGES = ("logs", "small", "costs", "big", "kill", "report")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per figure")
    ap.add_argument("--out", default=None, help="working folder (default: a temporary one)")
    size = ap.add_mutually_exclusive_group()
    size.add_argument(
        "--times-ram",
        type=float,
        default=1.5,
        help="the large table's rows and optimizer state over the machine's RAM (1.5)",
    )
    size.add_argument("--rows", type=int, default=None, help="the large table's rows")
    ap.add_argument("--log-rows", type=int, default=400_000, help="rows of the day's log")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="6GiB", help="per worker (6GiB)")
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated, in order")
    ap.add_argument("--redo", action="store_true", help="run stages whose result is saved")
    ap.add_argument("--keep", action="store_true", help="keep logs, inputs and results")
    ap.add_argument("--probe", default=None, help=argparse.SUPPRESS)  # the probe's subprocess
    args = ap.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(Path(args.probe))))
        return
    if args.rows is None:
        args.rows = int(args.times_ram * psutil.virtual_memory().total / ROW_BYTES) + 1
    rep = Reporter(args.json)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-scale-"))
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(args, out, rep)
    wanted = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = set(wanted) - set(STAGES)
    if unknown:
        raise SystemExit(f"--stages: unknown {sorted(unknown)}; stages are {', '.join(STAGES)}")
    for stage in STAGES:
        if stage not in wanted:
            continue
        if stage == "report":
            bench.report()
        elif stage not in bench.results or args.redo:
            progress(f"{stage} ...")
            t0 = time.perf_counter()
            result = getattr(bench, f"stage_{stage}")()
            bench.save(stage, result, time.perf_counter() - t0)
    # A stage that failed leaves everything in place, so the run resumes at it; a benchmark
    # that ran through removes what it wrote (the figures stay in results.json with --out).
    if not args.keep:
        for name in ("runs", "input", "logs"):
            shutil.rmtree(out / name, ignore_errors=True)
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()

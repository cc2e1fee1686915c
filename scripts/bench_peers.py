"""``daskhps train`` end to end against the script a user would otherwise write: plain PyTorch
in one process (``scripts/peer_torch.py``) and, where it is installed, TorchRec on the CPU
(``scripts/peer_torchrec.py``); the same generated logs, model, batch and optimizers.

    python scripts/bench_peers.py [--json] [--rounds 3] [--rows 1000000] [--quick]
                                  [--only daskhps,torch,torchrec] [--workers 1,2] [--out DIR]
                                  [--peer-threads N]

The logs: ``daskhps generate --days 2 --rows-per-day ROWS --parts-per-day 4 --vocab-scale 0.1
--seed 0`` (1,000,000 rows a day, 316,003 distinct keys in the first day); the first day
(day=2024-01-01) trains, the second is the holdout. ``--out DIR`` keeps them in
``DIR/rows-ROWS`` and reuses them while they are complete and generated with these settings,
so repeated benchmarking does not regenerate; without it they go to a temporary folder.

Every side trains DLRM (bottom MLP 13-64-16, dot interaction, top MLP 367-64-32-1, 27,601 dense
parameters), embeddings of dim 16 updated by Adagrad (lr 0.05), the dense layers by Adam (lr
0.001), batches of 4,096 examples in file order, one epoch, then the holdout AUC:

* daskhps: ``python -m daskhps.cli train CONFIG`` (what ``daskhps train`` runs) on the
  embedded LocalCluster of ``--workers`` worker processes, 1 thread each, sized as the
  quickstart is (``memory_limit: 3GiB``, device and host tiers 0.07 of it each: Dask's ``auto``
  limit splits the whole machine between the workers and the default tier fractions are of
  that, 7 GiB of tiers a worker here, which a machine shared with other work may not have);
  the default checkpoint after the pass, the run's report and the final evaluation included,
  as a user gets them. ``model.name: dlrm`` with its default widths, ``table.optimizer`` adagrad,
  ``dense_optimizer`` adam, ``passes.global_batch_size`` 4096, one pass (the default
  ``examples_per_pass`` holds the whole day).
* plain PyTorch: ``scripts/peer_torch.py`` (pandas' pyarrow reader, ``pandas.factorize``
  vocabularies, 26 ``nn.Embedding(sparse=True)`` tables with ``torch.optim.Adagrad``); see its
  docstring. It uses torch's default threads (2 here; ``--peer-threads`` sets them), a daskhps
  worker trains on 1 (``threads_per_worker``).
* TorchRec: ``scripts/peer_torchrec.py`` (TorchRec's DLRM over a ``FusedEmbeddingBagCollection``
  with fbgemm's fused Adagrad), run only where ``import torchrec`` works; otherwise the
  benchmark says why on one line (stderr) and goes on without it.

Each run is a fresh process, runs interleaved (daskhps with each worker count, plain
PyTorch, TorchRec; again ``--rounds`` times), and every figure is the median over the rounds:

* wall: seconds from starting the process until it exits; ``after_training_s`` beside it is
  the part after the training loop (wall less the time to the first step and the training
  seconds): the evaluation, and for daskhps the checkpoint, the report and the cluster's
  close.
* time to first step: seconds from starting the process until its first training step
  starts. The peers print the moment they enter their training loop. daskhps marks no such
  moment, so it is derived: the moment the run's first line of ``metrics.jsonl`` appears (the
  file is polled every 0.2 s; the line is written right after the pass trains), less that
  pass's ``seconds.train`` (the driver's time around the pass's training tasks), ``count``
  and ``unpin_repin``, the steps between the training and the line. It overstates the true
  moment by at most the poll interval and the small calls it does not time (the shards'
  stats). The part of it spent preparing the first pass (``seconds.route`` and
  ``stage_ahead``: reading its files again, routing and staging its keys) is reported beside
  it; the rest is the interpreter, the cluster's start and the scan of the whole log.
* training examples/s: examples trained over the training loop's seconds. daskhps: the
  passes' examples over their ``seconds.train`` in ``metrics.jsonl``; the peers: first step to
  last step. daskhps's ``worker_seconds`` beside it: the busiest rank's seconds in each stage
  of its steps (pull, forward_backward, push, dense_sync_step), summed over the passes.
* CPU seconds (user and sys) and minor page faults of the whole process tree: the deltas of
  ``resource.getrusage(RUSAGE_CHILDREN)`` around the run. They count a descendant once it and
  every process between it and the benchmark were waited for; daskhps's workers are children
  of a fork server the driver does not wait for, so the benchmark makes itself the reaper of
  orphaned descendants (Linux's child subreaper) and waits for them after each run. This is
  checked on every run: the tree is also polled with psutil every
  0.2 s (each live process's CPU seconds, last seen) and ``cpu_polled_s`` is reported beside
  it; it can only fall short (the last 0.2 s of each process), so rusage well below it would
  mean lost workers.
* peak memory: the highest sum over the tree of each process's proportional set size (PSS,
  shared pages split between the processes that map them), polled every 0.2 s; the highest
  sum of RSS (shared pages counted in every process) is reported beside it.
* holdout AUC: daskhps's ``summary.json`` (``final_eval``, over the whole second day); the
  peers' printed ``auc``.
* load average: the 1-minute load before each run (``os.getloadavg``); the median and range.

Ratios are daskhps / plain PyTorch (``ratio``), and daskhps / TorchRec (``ratio_torchrec``).
With ``--json`` each figure is one JSON object per line (``scripts/_bench.py``'s convention);
without it, a Markdown table of the medians follows. ``--quick``: 100,000 rows a day, one
round, a smoke run, not figures.

Measured (2-core x86 VM, 24 GiB, torch 2.13 CPU, TorchRec 1.8.0; shared with other work),
``python scripts/bench_peers.py --rounds 3``, medians of 3 rounds: see the end of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter

SCRIPTS = Path(__file__).resolve().parent
TRAIN_DAY, HOLDOUT_DAY = "2024-01-01", "2024-01-02"
POLL_S = 0.2
_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
PEER_SCRIPTS = {"torch": "peer_torch.py", "torchrec": "peer_torchrec.py"}
TITLES = {"torch": "plain PyTorch", "torchrec": "TorchRec"}


# -- data ------------------------------------------------------------------------------------


def logs(out: Path, rows: int) -> Path:
    """The two days of logs in ``out``, generated unless already there with these settings."""
    from daskhps.config.data import GenerateConfig

    gen = GenerateConfig(
        out=str(out), days=2, rows_per_day=rows, parts_per_day=4, vocab_scale=0.1, seed=0
    )
    t = time.perf_counter()
    if gen.ensure():
        print(f"generated {2 * rows:,} rows in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return out


def daskhps_config(data: Path, run_dir: Path, workers: int) -> dict[str, Any]:
    return {
        "run": {"name": f"peers-{workers}w", "seed": 0, "dir": str(run_dir)},
        "data": {"train": {"paths": [str(data)]}, "holdout": {"day": "last"}},
        "passes": {"epochs": 1, "global_batch_size": 4096},
        "table": {
            "dim": 16,
            "optimizer": {"kind": "adagrad", "lr": 0.05},
            "tiers": {"device": {"fraction": 0.07}, "host": {"fraction": 0.07}},
        },
        "model": {"name": "dlrm"},
        "dense_optimizer": {"kind": "adam", "lr": 1.0e-3},
        "cluster": {
            "n_workers": workers,
            "threads_per_worker": 1,
            "memory_limit": "3GiB",
            "gpu": False,
            "dashboard_address": "127.0.0.1:0",
        },
        "eval": {"every_pass": False},
    }


def torchrec_problem() -> str | None:
    """Why TorchRec's side cannot run here, or None when it can."""
    if importlib.util.find_spec("torchrec") is None:
        return "torchrec is not installed (see scripts/peer_torchrec.py for the install line)"
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torchrec.modules.fused_embedding_modules, torchrec.models.dlrm",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines() or ["no message"]
        return f"import torchrec failed: {lines[-1]}"
    return None


# -- one run -----------------------------------------------------------------------------------


class TreeSampler:
    """Polls a process and its descendants every 0.2 s: the peak sums of PSS and RSS, each
    process's CPU seconds last seen, and the moment a file first holds a whole line."""

    def __init__(self, pid: int, watch: Path | None = None) -> None:
        self.root = psutil.Process(pid)
        self.watch = watch
        self.line_at: float | None = None
        self.peak_pss = self.peak_rss = 0
        self.cpu: dict[tuple[int, float], float] = {}  # (pid, start time): user + sys
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(POLL_S)

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            procs = []
        pss = rss = 0
        for p in procs:
            try:
                with p.oneshot():
                    mem = p.memory_full_info()
                    t = p.cpu_times()
                    key = (p.pid, p.create_time())
            except psutil.Error:
                continue
            pss += mem.pss
            rss += mem.rss
            self.cpu[key] = t.user + t.system
        self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)
        if self.watch is not None and self.line_at is None:
            try:
                if b"\n" in self.watch.read_bytes():
                    self.line_at = time.time()
            except OSError:
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (Linux): daskhps's embedded
    cluster forks its workers from a fork server that the driver does not wait for, so their
    CPU seconds reach ``RUSAGE_CHILDREN`` only when this process waits for the server."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans(timeout_s: float = 60.0) -> None:
    """Wait for every orphan handed to this process (see :func:`adopt_orphans`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # none left
        if pid == 0:
            time.sleep(0.05)
    raise SystemExit(f"orphaned processes still running {timeout_s:.0f} s after the run")


def run_measured(cmd: list[str], log: Path, watch: Path | None = None) -> dict[str, Any]:
    """Run ``cmd`` to its end; wall, CPU, page faults, peak memory of its process tree."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    t = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        sampler = TreeSampler(proc.pid, watch)
        rc = proc.wait()
    wall = time.perf_counter() - t
    sampler.stop()
    reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(cmd[1:3])} exited {rc}:\n{tail}")
    counted = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    polled = sum(sampler.cpu.values())
    if counted < 0.9 * polled:  # polling can only fall short: descendants were not counted
        raise SystemExit(
            f"{' '.join(cmd[1:3])}: getrusage counted {counted:.1f} CPU seconds, polling saw "
            f"{polled:.1f}: some descendants were never waited for"
        )
    return {
        "started": started,
        "wall_s": wall,
        "cpu_user_s": after.ru_utime - before.ru_utime,
        "cpu_sys_s": after.ru_stime - before.ru_stime,
        "cpu_polled_s": sum(sampler.cpu.values()),
        "processes": len(sampler.cpu),
        "minflt": after.ru_minflt - before.ru_minflt,
        "peak_pss_mib": sampler.peak_pss / 2**20,
        "peak_rss_mib": sampler.peak_rss / 2**20,
        "line_at": sampler.line_at,
        "load": load,
    }


def run_daskhps(data: Path, tmp: Path, workers: int) -> dict[str, Any]:
    run_dir = tmp / f"run-{workers}w"
    shutil.rmtree(run_dir, ignore_errors=True)
    config = tmp / f"daskhps-{workers}w.yaml"
    config.write_text(yaml.safe_dump(daskhps_config(data, run_dir, workers), sort_keys=False))
    cmd = [sys.executable, "-m", "daskhps.cli", "train", str(config)]
    log = tmp / f"daskhps-{workers}w.log"
    r = run_measured(cmd, log, watch=run_dir / "metrics.jsonl")
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    passes = [p for p in records if "examples" in p]  # not a restart's line
    summary = json.loads((run_dir / "summary.json").read_text())
    first = passes[0]["seconds"]
    if r["line_at"] is None:
        raise SystemExit(f"never saw a line of {run_dir / 'metrics.jsonl'}")
    after_start = first["train"] + first.get("count", 0.0) + first.get("unpin_repin", 0.0)
    r["first_step_s"] = r["line_at"] - after_start - r["started"]
    r["prepare_first_pass_s"] = first.get("route", 0.0) + first.get("stage_ahead", 0.0)
    r["examples"] = sum(int(p["examples"]) for p in passes)
    r["train_s"] = sum(float(p["seconds"]["train"]) for p in passes)
    r["examples_per_s"] = r["examples"] / r["train_s"]
    stages: dict[str, float] = {}
    for p in passes:
        for k, v in p.get("worker_seconds", {}).items():
            stages[k] = stages.get(k, 0.0) + float(v)
    r["worker_seconds"] = stages
    r["auc"] = float(summary["final_eval"]["auc"])
    r["passes"] = len(passes)
    shutil.rmtree(run_dir, ignore_errors=True)
    return r


def run_peer(side: str, data: Path, tmp: Path, threads: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(SCRIPTS / PEER_SCRIPTS[side]),
        "--train",
        str(data / f"day={TRAIN_DAY}"),
        "--holdout",
        str(data / f"day={HOLDOUT_DAY}"),
        "--threads",
        str(threads),
    ]
    log = tmp / f"{side}.log"
    r = run_measured(cmd, log)
    printed = [x for x in log.read_text(errors="replace").splitlines() if x.startswith("{")]
    out = json.loads(printed[-1])
    r["first_step_s"] = out["first_step_at"] - r["started"]
    r["examples"] = out["examples"]
    r["train_s"] = out["train_s"]
    r["examples_per_s"] = out["examples_per_s"]
    r["auc"] = out["auc"]
    r["torch_threads"] = out["torch_threads"]
    return r


# -- figures ---------------------------------------------------------------------------------

# (key, name, unit); lower is better for all but examples/s and AUC.
FIGURES = [
    ("wall_s", "wall", "s"),
    ("first_step_s", "time to first training step", "s"),
    ("examples_per_s", "training examples/s", "examples/s"),
    ("cpu_s", "CPU seconds, user + sys, process tree", "s"),
    ("minflt", "minor page faults, process tree", "faults"),
    ("peak_pss_mib", "peak memory (PSS), process tree", "MiB"),
    ("auc", "holdout AUC", "auc"),
]


def median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs)


def report(rep: Reporter, runs: dict[str, list[dict[str, Any]]], as_json: bool) -> None:
    for rs in runs.values():
        for r in rs:
            r["cpu_s"] = r["cpu_user_s"] + r["cpu_sys_s"]
            r["after_training_s"] = r["wall_s"] - r["first_step_s"] - r["train_s"]
    base = runs.get("torch")
    trec = runs.get("torchrec")
    for key, name, unit in FIGURES:
        for side, rs in runs.items():
            extra: dict[str, Any] = {"runs": [round(float(r[key]), 3) for r in rs]}
            if key == "wall_s":
                extra["after_training_s"] = round(median(rs, "after_training_s"), 2)
            if key == "examples_per_s" and "worker_seconds" in rs[0]:
                extra["worker_seconds"] = {
                    k: round(statistics.median(r["worker_seconds"][k] for r in rs), 2)
                    for k in rs[0]["worker_seconds"]
                }
            if key == "cpu_s":
                extra["user_s"] = round(median(rs, "cpu_user_s"), 1)
                extra["sys_s"] = round(median(rs, "cpu_sys_s"), 1)
                extra["cpu_polled_s"] = round(median(rs, "cpu_polled_s"), 1)
            if key == "peak_pss_mib":
                extra["peak_rss_mib"] = round(median(rs, "peak_rss_mib"), 1)
            if key == "first_step_s" and side.startswith("daskhps"):
                extra["prepare_first_pass_s"] = round(median(rs, "prepare_first_pass_s"), 2)
            if trec is not None and side != "torchrec":
                extra["ratio_torchrec"] = round(median(rs, key) / median(trec, key), 4)
            with_base = base is not None and side != "torch"
            rep.emit(
                f"{name}, {title(side)}",
                median(rs, key),
                unit,
                baseline=median(base, key) if base is not None and with_base else None,
                baseline_name=TITLES["torch"] if with_base else None,
                **extra,
            )
    loads = [r["load"] for rs in runs.values() for r in rs]
    rep.emit(
        "load average (1 min) before each run",
        statistics.median(loads),
        "load",
        min=round(min(loads), 2),
        max=round(max(loads), 2),
        cores=os.cpu_count(),
    )
    if not as_json:
        print()
        print(markdown(runs))


def title(side: str) -> str:
    if side.startswith("daskhps-"):
        n = int(side.split("-")[1])
        return f"daskhps, {n} worker{'s' if n > 1 else ''}"
    return TITLES[side]


def markdown(runs: dict[str, list[dict[str, Any]]]) -> str:
    """The medians, one column a side, then daskhps's ratios to each peer that ran."""
    sides = list(runs)
    pairs = [(s, p) for s in sides if s.startswith("daskhps") for p in TITLES if p in runs]
    head = [*(title(s) for s in sides), *(f"{short(s)} / {TITLES[p]}" for s, p in pairs)]
    rows = ["| figure (median) | " + " | ".join(head) + " |", "| --- |" + " --- |" * len(head)]
    for key, name, unit in FIGURES:
        cells = [number(median(runs[s], key), unit) for s in sides]
        cells += [f"{median(runs[s], key) / median(runs[p], key):.2f}" for s, p in pairs]
        rows.append(f"| {name} ({unit}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def short(side: str) -> str:
    return f"daskhps {side.split('-')[1]}w"


def number(v: float, unit: str) -> str:
    if unit == "auc":
        return f"{v:.4f}"
    return f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows per day (2 days)")
    ap.add_argument("--quick", action="store_true", help="100,000 rows a day, 1 round")
    ap.add_argument("--only", default="daskhps,torch,torchrec", help="sides to run")
    ap.add_argument("--workers", default="1,2", help="daskhps's worker counts")
    ap.add_argument("--out", type=Path, help="keep (and reuse) the generated logs here")
    ap.add_argument(
        "--peer-threads", type=int, default=0, help="the peers' torch threads (0: torch's default)"
    )
    args = ap.parse_args()
    if args.quick:
        args.rows, args.rounds = 100_000, 1
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - {"daskhps", "torch", "torchrec"}
    if unknown:
        ap.error(f"--only: unknown sides {', '.join(sorted(unknown))}")
    sides = [f"daskhps-{int(w)}" for w in args.workers.split(",")] if "daskhps" in only else []
    sides += [s for s in ("torch", "torchrec") if s in only]
    adopt_orphans()
    if "torchrec" in sides and (why := torchrec_problem()):
        print(f"TorchRec skipped: {why}", file=sys.stderr)
        sides.remove("torchrec")
    if not sides:
        ap.error("nothing to run")
    rep = Reporter(args.json)
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as t:
        tmp = Path(t)
        data = logs((args.out or tmp / "logs") / f"rows-{args.rows}", args.rows)
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
        for i in range(args.rounds):
            for side in sides:
                if side.startswith("daskhps-"):
                    r = run_daskhps(data, tmp, int(side.split("-")[1]))
                else:
                    r = run_peer(side, data, tmp, args.peer_threads)
                runs[side].append(r)
                print(
                    f"round {i + 1}/{args.rounds} {title(side)}: wall {r['wall_s']:.1f} s, "
                    f"{r['examples_per_s']:,.0f} examples/s, AUC {r['auc']:.4f}, "
                    f"load {r['load']:.2f}",
                    file=sys.stderr,
                )
        report(rep, runs, args.json)


if __name__ == "__main__":
    main()

"""Benchmark ``daskhps serve`` on loopback, each figure against a floor in the same run.

    python scripts/bench_online.py [--json] [--quick] [--out DIR]

Setup: two days of synthetic Criteo-format logs (``--rows`` a day, the generator's full
vocabularies), one training run over day 1 on one local worker with two checkpoints (passes),
and a retraining registry whose ``CURRENT`` is pass 1 (v000001). The requests are day 2's rows,
sent as JSON rows of strings (what a caller holds), by clients in this process with kept-alive
connections. Every loop is bounded in count and in time.

The floor: ``daskhps export``'s output of v000001 served by a minimal tornado handler
(scripts/_online_floor.py), written as a user would write it naively: parse the JSON, key the
cells with daskhps's hash, a plain dict of key -> row of the dump, the TorchScript model, a JSON
answer; no validation, version, metrics or cache. It runs as a process of its own, beside the
server, and is measured in the same loops (alternating with it): what a request costs at the
least in Python on this machine. Its scores must match the server's (checked, and reported).

1. latency at batch sizes 1, 64, 1024, 16384 (one client, one server process, caches warmed
   by ``--warmup``): p50 and p99 against the floor's; beside them the in-process best case of
   before the floor: the server's parser in-process, then the exported model over the whole
   table (searchsorted), no HTTP. Goals: batch 1 at most 1 ms, batch 1024 at most 15 ms;
2. QPS (batch 64) with 1, 2 and 4 concurrent clients against 1 and 2 server processes, each
   against the floor's QPS (one process) with as many clients, in alternating rounds; and each
   process's PSS (``/proc/PID/smaps_rollup``) beside its RSS;
3. a refresh under load: 2 clients send batch-64 requests while v000002 (pass 2) is published;
   the failed requests (goal: 0), the time from publish to the first answer of v000002, how
   long the swap held requests, and p50/p99 latency during the move against before it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter

from daskhps.config import RunConfig
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.retrain.publish import freeze_version
from daskhps.retrain.versions import Attempt, Registry, Version
from daskhps.runfiles.checkpoint import list_checkpoints
from daskhps.serve import load_servable
from daskhps.serve.client import ServeClient
from daskhps.serve.export import EMBEDDINGS, KEYS, META, MODEL, export_model
from daskhps.serve.requests import read_rows
from daskhps.table.init import init_embedding
from daskhps.training.trainer import Trainer

BATCHES = (1, 64, 1024, 16384)
QUICK_BATCHES = (1, 64, 1024, 4096)  # the smoke run: the largest batch's path, not its size
JSON, PROBS = "application/json", "probabilities"
COLUMNS = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]


def _train(out: Path, rows: int) -> tuple[RunConfig, Path]:
    logs = out / "logs"
    generate(GeneratorConfig(days=2, rows_per_day=rows, parts_per_day=1, seed=11), str(logs))
    cfg = RunConfig.from_dict(
        {
            "run": {"name": "online", "dir": str(out / "run"), "seed": 1, "quiet": True},
            "data": {"train": {"paths": [str(logs / "day=2024-01-01")]}},
            "passes": {"epochs": 1, "examples_per_pass": rows // 2, "global_batch_size": 4096},
            "table": {"dim": 16, "optimizer": {"kind": "adagrad", "lr": 0.05},
                      "tiers": {"host": {"fraction": 0.2}}},
            "cluster": {"n_workers": 1, "threads_per_worker": 2, "memory_limit": "6GiB",
                        "dashboard_address": None},
            "eval": {"every_pass": False},
        },
        source="bench_online",
    )  # fmt: skip
    Trainer(cfg, progress=False).run()
    return cfg, next((logs / "day=2024-01-02").glob("part-*"))


def _publish(reg: Registry, name: str, ckpt: Any) -> None:
    frozen = freeze_version(ckpt, reg.folder / name, name)
    days = ("2024-01-01",)
    reg.publish(
        Version(name, str(frozen.path), frozen.commit, str(frozen.stores_dir), None, days,
                days[0], "2024-01-02"),
        Attempt(f"a-{name}", None, days, "2024-01-02", "published", name),
    )  # fmt: skip


def _json_rows(day: Path) -> list[dict[str, str]]:
    raw = pd.read_csv(day, sep="\t", header=None, names=COLUMNS, dtype=str, keep_default_na=False)
    raw = raw.drop(columns="label")
    return [{k: v for k, v in r.items() if v} for r in raw.to_dict("records")]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FloorServer:
    """The floor (scripts/_online_floor.py) on a free port, over an export folder."""

    def __init__(self, export: Path) -> None:
        self.url = f"http://127.0.0.1:{_port()}"
        script = Path(__file__).resolve().parent / "_online_floor.py"
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(export), self.url.rsplit(":", 1)[1]],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit("the floor server did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


class Served:
    """A ``daskhps serve`` process tree on a free port."""

    def __init__(self, model: Path, processes: int, warmup: Path, log: Path) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "a")  # noqa: SIM115 -- open for the server's life
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daskhps.cli", "serve", "--model", str(model), "--port",
             str(self.port), "--processes", str(processes), "--warmup", str(warmup),
             "--poll-s", "0.2"],
            stdout=self._log, stderr=self._log,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        want = processes
        while self._ready_processes() < want:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"daskhps serve did not start; see {log}")
            time.sleep(0.5)

    def pids(self) -> list[int]:
        p = psutil.Process(self.proc.pid)
        kids = [
            c.pid
            for c in p.children(recursive=True)
            if "resource_tracker" not in " ".join(c.cmdline())
        ]
        return kids or [self.proc.pid]

    def _ready_processes(self) -> int:
        log = Path(self._log.name).read_text()
        return log.count(f"ready on http://127.0.0.1:{self.port}")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self._log.close()


def _latencies(url: str, body: bytes, count: int, seconds: float) -> list[float]:
    """Seconds from sending an encoded body to holding the decoded answer, one request at a
    time (the body is encoded once: the in-process baseline starts from the same bytes)."""
    out: list[float] = []
    with ServeClient(url) as c:
        for _ in range(3):  # the connection, the keys, TorchScript's profiling runs (floor)
            c.request("POST", "/predict", body, JSON)
        end = time.monotonic() + seconds
        while len(out) < count and time.monotonic() < end:
            t = time.perf_counter()
            status, data = c.request("POST", "/predict", body, JSON)
            json.loads(data)
            out.append(time.perf_counter() - t)
            if status != 200:
                raise SystemExit(f"the server answered {status}: {data[:300]!r}")
    return out


def _alternating(
    url: str, floor: str, body: bytes, count: int, seconds: float
) -> tuple[list[float], list[float]]:
    """Latencies of the server and of the floor, in four alternating rounds each."""
    lat: list[float] = []
    flat: list[float] = []
    for _ in range(4):
        lat += _latencies(url, body, max(1, count // 4), seconds / 4)
        flat += _latencies(floor, body, max(1, count // 4), seconds / 4)
    return lat, flat


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


class InProcess:
    """The best case without HTTP: the server's parser, then the exported model over the
    whole table in memory."""

    def __init__(self, run_dir: Path, out: Path) -> None:
        servable = load_servable(run_dir)
        export_model(servable, out)
        self.meta = json.loads((out / META).read_text())
        self.schema = servable.config.data.schema
        keys, emb = np.load(out / KEYS), np.load(out / EMBEDDINGS)
        order = np.argsort(keys)
        self.keys, self.emb = keys[order], emb[order]
        self.model = torch.jit.load(str(out / MODEL))

    def score(self, body: bytes) -> np.ndarray:
        frame = read_rows(body, "application/json", self.schema, 1 << 20)
        fields = self.meta["inputs"]["sparse"]["fields"]
        k = frame[fields].to_numpy(np.int64).reshape(-1)
        pos = np.minimum(np.searchsorted(self.keys, k), len(self.keys) - 1)
        hit = self.keys[pos] == k
        rows = self.emb[pos]
        if not hit.all():
            init = self.meta["unseen_keys"]
            rows[~hit] = init_embedding(torch.from_numpy(k[~hit]), seed=init["seed"],
                                        dim=init["dim"], scale=init["scale"]).numpy()  # fmt: skip
        dense = torch.from_numpy(frame[list(self.schema.dense_names)].to_numpy(np.float32).copy())
        sparse = torch.from_numpy(rows).view(len(frame), len(fields), -1)
        with torch.no_grad():
            return torch.sigmoid(self.model(dense, sparse)).numpy()


def _qps_alternating(
    url: str, floor: str, rows: list[dict[str, str]], clients: int, seconds: float
) -> tuple[float, float]:
    """Requests a second of the server and of the floor, in two alternating rounds each."""
    got: dict[str, list[tuple[int, float]]] = {url: [], floor: []}
    for _ in range(2):
        for u in (url, floor):
            got[u].append(_qps(u, rows, clients, seconds / 2))
    serve, flo = (sum(n for n, _ in got[u]) / sum(t for _, t in got[u]) for u in (url, floor))
    return serve, flo


def _qps(url: str, rows: list[dict[str, str]], clients: int, seconds: float) -> tuple[int, float]:
    """(requests answered, seconds) of ``clients`` loops of requests, after a ramp up."""
    counts = [0] * clients
    stop = threading.Event()

    def loop(i: int) -> None:
        with ServeClient(url) as c:
            while not stop.is_set():
                c.predict(rows)
                counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # ramp up
    before, t0 = sum(counts), time.perf_counter()
    time.sleep(seconds)
    done, dt = sum(counts) - before, time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join(60)
    return done, dt


def _pss(pid: int) -> tuple[int, int]:
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value) * 1024
    return fields["Pss"], fields["Rss"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="small sizes (the suite's smoke run)")
    ap.add_argument("--out", default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--rows", type=int, default=None, help="rows a day (default 200000)")
    args = ap.parse_args()
    rep = Reporter(args.json)
    rows_a_day = args.rows or (20_000 if args.quick else 200_000)
    seconds = 0.5 if args.quick else 8.0
    count = 20 if args.quick else 400
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        cfg, day2 = _train(out, rows_a_day)
        ckpts = list_checkpoints(cfg.run.dir)
        reg = Registry(out / "retrain" / "versions")
        _publish(reg, "v000001", ckpts[0])
        rows = _json_rows(day2)
        log = out / "serve.log"
        best = InProcess(Path(reg.get("v000001").checkpoint), out / "export")

        # One single-process server answers the latency runs, the one-process QPS runs and
        # the refresh under load (a start costs seconds; the runs do not change what it
        # serves until the refresh, which comes last).
        floor = FloorServer(out / "export")
        single = Served(out / "retrain", 1, day2, log)
        try:
            # 1. latency against the floor
            for b in QUICK_BATCHES if args.quick else BATCHES:
                batch = rows[:b]
                body = json.dumps({"rows": batch}).encode()
                n = count if b < 4096 else count // 8
                lat, flat = _alternating(single.url, floor.url, body, n, seconds)
                inproc = [_timed(best.score, body) for _ in range(max(5, min(len(lat), 50)))]
                rep.emit(f"serve p50, batch {len(batch)}", statistics.median(lat) * 1e3, "ms",
                         baseline=statistics.median(flat) * 1e3, baseline_name="floor p50",
                         p99_ms=round(_pct(lat, 99) * 1e3, 3),
                         floor_p99_ms=round(_pct(flat, 99) * 1e3, 3),
                         in_process_ms=round(statistics.median(inproc) * 1e3, 3),
                         requests=len(lat))  # fmt: skip
            body = json.dumps({"rows": rows[:64]}).encode()
            with ServeClient(single.url) as c, ServeClient(floor.url) as f:
                got = np.array(json.loads(c.request("POST", "/predict", body, JSON)[1])[PROBS])
                want = np.array(json.loads(f.request("POST", "/predict", body, JSON)[1])[PROBS])
            rep.emit("floor vs serve: max |p difference|, batch 64", float(abs(got - want).max()),
                     "")  # fmt: skip

            # 2. QPS against the floor with as many clients, alternating; PSS of each process
            try:
                for processes in (1, 2):
                    served = single if processes == 1 else Served(out / "retrain", 2, day2, log)
                    try:
                        for clients in (1, 2, 4):
                            qps, fqps = _qps_alternating(
                                served.url, floor.url, rows[:64], clients, seconds
                            )
                            name = f"QPS batch 64, {clients} clients, {processes} processes"
                            floor_name = f"floor (one process), {clients} clients"
                            rep.emit(name, qps, "req/s", baseline=fqps, baseline_name=floor_name)
                        for pid in served.pids():
                            pss, rss = _pss(pid)
                            rep.emit(f"PSS of a server process ({processes} processes)",
                                     pss / 2**20, "MiB", baseline=rss / 2**20,
                                     baseline_name="its RSS")  # fmt: skip
                    finally:
                        if served is not single:
                            served.close()
            finally:
                floor.close()

            # 3. a refresh under load
            before, during, failed = _refresh_under_load(single.url, rows[:64], reg, ckpts[1])
            pause = _pause(single.url)
        finally:
            single.close()
        rep.emit("refresh under load: failed requests", float(failed), "requests")
        rep.emit("refresh under load: publish to first v000002 answer", during["seconds"], "s")
        rep.emit("refresh under load: requests held by the swap", pause * 1e3, "ms")
        rep.emit("refresh under load: p50 during the move", _pct(during["lat"], 50) * 1e3, "ms",
                 baseline=_pct(before, 50) * 1e3, baseline_name="p50 before",
                 p99_ms=round(_pct(during["lat"], 99) * 1e3, 3),
                 p99_before_ms=round(_pct(before, 99) * 1e3, 3))  # fmt: skip
        load = os.getloadavg()
        rep.emit("load average (1, 5, 15 min)", load[0], "", five=load[1], fifteen=load[2],
                 rows_a_day=rows_a_day, stored_keys=len(best.keys))  # fmt: skip


def _timed(fn: Any, *a: Any) -> float:
    t = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t


def _refresh_under_load(
    url: str, rows: list[dict[str, str]], reg: Registry, ckpt: Any
) -> tuple[list[float], dict[str, Any], int]:
    samples: list[tuple[float, float, str]] = []  # (end time, latency, version)
    failed = [0]
    stop = threading.Event()

    def loop() -> None:
        with ServeClient(url) as c:
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    v = c.predict(rows).version
                except Exception:
                    failed[0] += 1
                    continue
                samples.append((time.perf_counter(), time.perf_counter() - t, v))

    threads = [threading.Thread(target=loop) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    t_pub = time.perf_counter()
    _publish(reg, "v000002", ckpt)
    deadline = time.monotonic() + 120
    while not any(v == "v000002" for _, _, v in samples[-50:]) and time.monotonic() < deadline:
        time.sleep(0.01)
    t_new = min((e for e, _, v in samples if v == "v000002"), default=float("nan"))
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(60)
    before = [lat for e, lat, _ in samples if e < t_pub]
    during = [lat for e, lat, _ in samples if t_pub <= e <= t_new + 0.5]
    return before, {"seconds": t_new - t_pub, "lat": during}, failed[0]


def _pause(url: str) -> float:
    with ServeClient(url) as c:
        for line in c.metrics().splitlines():
            if line.startswith("daskhps_serve_refresh_pause_seconds "):
                return float(line.split()[-1])
    return float("nan")


if __name__ == "__main__":
    main()

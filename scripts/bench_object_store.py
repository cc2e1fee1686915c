"""Benchmark click logs read from object storage: a day read and trained from an S3-compatible
server against the same files read from local disk, same machine, same run.

    python scripts/bench_object_store.py [--json] [--quick] [--rows N] [--parts P]
                                         [--block-size 16MiB] [--s3-block-size 1MiB]
                                         [--threads T] [--repeat R] [--train-rows N]
                                         [--pass-rows N] [--train-rounds R] [--no-train]
                                         [--results FILE] [--out DIR] [--keep]

It needs s3fs and moto[server]. It starts moto's S3 server on 127.0.0.1 (``python -m
moto.server``, a process of its own, fake credentials), generates a day of Criteo-format logs
(``--rows``, 2M by default, in ``--parts`` plain-text files, ``vocab_scale`` 0.1) into a local
folder and uploads the folder to a bucket. It measures (about 4 minutes on 2 cores):

* reading: ``read_click_log(...).frame`` of the whole day, each partition parsed and counted
  (``map_partitions(len)``: nothing but the partitions being read is held), computed with the
  threaded scheduler (``--threads``, 2 by default) in a fresh process per read (its imports
  are not timed), from the bucket against from the folder: rows/s and their ratio, the
  medians of ``--repeat`` rounds (3), the two sides interleaved (the order flips every
  round). Three ways: in blocks of ``--block-size`` (``data.block_size``: bounded memory, a
  block per thread) with s3fs's own read-ahead (``default_block_size``, 50 MiB), the same
  blocks with ``storage.options.s3.default_block_size`` set to ``--s3-block-size``, and whole
  files (``block_size`` null). For each read: its peak RSS (the process's ``VmHWM``;
  ``ru_maxrss`` would carry the parent's RSS over ``exec``) and its growth over the RSS
  before the read; the CPU seconds of the reading process and of the server, and the ratio
  they predict were the read bound by the cores they share (local CPU seconds over the
  server side's); the bytes and GET requests s3fs fetched (counted in
  ``S3File._fetch_range`` and ``S3FileSystem._cat_file``) over the log's bytes: the read
  amplification;
* the server's raw GET throughput: every object of the day fetched whole with s3fs
  ``cat_file``, one at a time and two at once, against reading the local files whole, and
  fetched in ranges of ``--block-size``; moto's and the client's CPU seconds per GB; the
  medians of ``--repeat`` rounds. moto is one Python process: its throughput, and its CPU
  taken from the cores the reader uses, are bounds a real S3 does not have. Each read from
  the server is then set against the longer of the local read and its fetched bytes at that
  rate (the least it could take);
* training: a second day of ``--train-rows`` rows (500k by default, ``--parts`` files of it,
  same generator settings) trained with ``daskhps.train`` on the embedded LocalCluster (2
  worker processes, 2 threads each) from the bucket (``storage.options``) and from the folder,
  in passes of ``--pass-rows`` (100k) with the same ``data.block_size``: the training
  examples/s of ``metrics.jsonl`` (a pass's examples over its ``seconds.train``, while the
  workers read the next pass; the median over the passes after the first) and the whole
  run's examples over its wall seconds (cluster start and the log's scan, a read of the whole
  day, included). ``--train-rounds`` runs of each (3), interleaved.

``--quick`` is a smoke run (40k rows, blocks of 256 KiB, one round), not figures. Every
figure is printed as one line (``--json``: one JSON object per line, the convention of
``scripts/_bench.py``), then, without ``--json``, a table of them in Markdown; ``--results
FILE`` also writes them all as one JSON document, with the settings, every run and the load
averages. The logs and the runs are removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter

KEY, SECRET = "daskhps-bench-key", "daskhps-bench-secret"  # fake: moto takes any
BUCKET = "clicks"


@dataclass(frozen=True)
class Server:
    """moto's S3 server running on 127.0.0.1: its endpoint and process id."""

    endpoint: str
    pid: int

    @property
    def options(self) -> dict[str, dict[str, Any]]:
        """``storage.options`` reaching it."""
        return options(self.endpoint)

    def fs(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.options["s3"])

    def cpu_seconds(self) -> float:
        import psutil

        t = psutil.Process(self.pid).cpu_times()
        return float(t.user + t.system)


def options(endpoint: str, s3_block: int | None = None) -> dict[str, dict[str, Any]]:
    """``storage.options`` reaching the server at ``endpoint``; ``s3_block``: s3fs's
    ``default_block_size`` (what one GET of a file opened for reading fetches ahead)."""
    opts: dict[str, Any] = {"endpoint_url": endpoint, "key": KEY, "secret": SECRET}
    if s3_block:
        opts["default_block_size"] = s3_block
    return {"s3": opts}


@contextmanager
def s3_server() -> Iterator[Server]:
    """moto's server on a free port of 127.0.0.1, in a process of its own (started as the
    tests start it, tests/_s3.py); stopped after."""
    try:
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"bench_object_store needs s3fs and moto[server]: {e}") from None
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tests/
    from tests._s3 import s3_server as start

    with start() as server:
        yield Server(server.endpoint, server.pid)


def upload(server: Server, local: Path, prefix: str) -> str:
    """Every file under ``local`` copied to ``s3://BUCKET/prefix`` (keeping the tree)."""
    fs = server.fs()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    for f in sorted(p for p in local.rglob("*") if p.is_file()):
        fs.put_file(str(f), f"{BUCKET}/{prefix}/{f.relative_to(local).as_posix()}")
    return f"s3://{BUCKET}/{prefix}"


def log_files(local: Path) -> list[Path]:
    return sorted(p for p in local.rglob("part-*") if p.is_file())


def peak_rss() -> int | None:
    """The peak RSS of this process's memory since its ``exec`` (Linux's ``VmHWM``), None
    where /proc does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return None


class RssSampler:
    """The highest RSS of this process, sampled every 5 ms from a thread (where /proc has no
    ``VmHWM``)."""

    def __init__(self) -> None:
        import psutil

        self.me = psutil.Process()
        self.peak = self.me.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.me.memory_info().rss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self.me.memory_info().rss)


def count_fetches() -> dict[str, int]:
    """Count the bytes and requests of every range s3fs fetches from now on (each a GET):
    through a buffered file (``S3File._fetch_range``: whole files, gzip) and by ranged reads
    (``S3FileSystem._cat_file``: the blocks of plain text)."""
    from s3fs.core import S3File, S3FileSystem

    got = {"bytes": 0, "requests": 0}
    fetch = S3File._fetch_range
    cat = S3FileSystem._cat_file
    lock = threading.Lock()  # the scheduler's threads fetch at once

    def add(n: int) -> None:
        with lock:
            got["bytes"] += n
            got["requests"] += 1

    def counted(self: Any, start: int, end: int) -> Any:
        data = fetch(self, start, end)
        add(len(data))
        return data

    async def counted_cat(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        data = await cat(self, path, *args, **kwargs)
        add(len(data))
        return data

    S3File._fetch_range = counted  # type: ignore[method-assign]
    S3FileSystem._cat_file = counted_cat  # type: ignore[method-assign]
    return got


# ---------------------------------------------------------------------------------------------
# One read, in a process of its own


def read_once(
    where: str, block_size: int | None, threads: int, endpoint: str | None, s3_block: int | None
) -> None:
    """Read ``where`` (a folder or a URL) with ``read_click_log`` and print one JSON line:
    rows, seconds, the process's RSS before the read and its peak, and its CPU seconds."""
    import psutil

    from daskhps import storage
    from daskhps.data.readers import read_click_log

    fetched = None
    if endpoint:
        storage.use_options(options(endpoint, s3_block))
        fetched = count_fetches()
    before = psutil.Process().memory_info().rss
    sampler = RssSampler()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    log = read_click_log(where, block_size=block_size)
    counts = log.frame.map_partitions(len).compute(scheduler="threads", num_workers=threads)
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    sampled = sampler.stop()
    out = {
        "rows": int(counts.sum()),
        "partitions": len(log.parts),
        "seconds": seconds,
        "cpu_s": cpu,
        "rss_before": before,
        "rss_peak": peak_rss() or sampled,
        "rss_peak_sampled": sampled,
        "fetched_bytes": fetched["bytes"] if fetched else None,
        "get_requests": fetched["requests"] if fetched else None,
    }
    print(json.dumps(out), flush=True)


@dataclass(frozen=True)
class Mode:
    """How the day is read: ``block_size`` as ``data.block_size`` (None: whole files),
    ``s3_block`` as s3fs's ``default_block_size`` (None: s3fs's own, 50 MiB)."""

    name: str
    block_size: int | None
    s3_block: int | None = None


def read_in_child(where: str, mode: Mode, threads: int, server: Server | None) -> dict:
    """:func:`read_once` in a fresh interpreter; its figures, with the server's CPU seconds
    over the read."""
    cmd = [sys.executable, __file__, "--read-child", where, "--threads", str(threads)]
    cmd += ["--child-block-size", str(mode.block_size or 0)]
    if server is not None:
        cmd += ["--endpoint", server.endpoint, "--child-s3-block-size", str(mode.s3_block or 0)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    srv0 = server.cpu_seconds() if server else 0.0
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    srv1 = server.cpu_seconds() if server else 0.0
    if res.returncode != 0:
        raise SystemExit(f"reading {where} failed:\n{res.stderr[-3000:]}")
    rec: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    rec["server_cpu_s"] = srv1 - srv0
    return rec


# ---------------------------------------------------------------------------------------------
# The measurements


def _median(recs: list[dict], key: str) -> float:
    return float(statistics.median(r[key] for r in recs))


def measure_reads(
    rep: Reporter,
    figures: dict[str, Any],
    server: Server,
    local: Path,
    url: str,
    rows: int,
    modes: list[Mode],
    threads: int,
    repeat: int,
) -> None:
    log_bytes = sum(p.stat().st_size for p in log_files(local))
    for m in modes:
        mode = m.name
        runs: dict[str, list[dict]] = {"local": [], "server": []}
        for r in range(repeat):
            sides = ("local", "server") if r % 2 == 0 else ("server", "local")
            for side in sides:
                where = str(local) if side == "local" else url
                rec = read_in_child(where, m, threads, server if side == "server" else None)
                if rec["rows"] != rows:
                    raise SystemExit(f"{where}: read {rec['rows']} rows, expected {rows}")
                runs[side].append(rec)
        loc, srv = runs["local"], runs["server"]
        loc_rate = rows / _median(loc, "seconds")
        srv_rate = rows / _median(srv, "seconds")
        load = round(os.getloadavg()[0], 2)
        fetched = statistics.median(r["fetched_bytes"] for r in srv)
        requests = statistics.median(r["get_requests"] for r in srv)
        rep.emit(
            f"read a {rows:,}-row day from the S3 server, {mode}",
            srv_rate,
            "rows/s",
            baseline=loc_rate,
            baseline_name="the same files from local disk",
            partitions=srv[0]["partitions"],
            server_mb_s=round(log_bytes / _median(srv, "seconds") / 1e6, 1),
            local_mb_s=round(log_bytes / _median(loc, "seconds") / 1e6, 1),
            runs_s=[round(r["seconds"], 2) for r in srv],
            baseline_runs_s=[round(r["seconds"], 2) for r in loc],
            load=load,
        )
        peak_srv, peak_loc = _median(srv, "rss_peak"), _median(loc, "rss_peak")
        grow_srv = statistics.median(r["rss_peak"] - r["rss_before"] for r in srv)
        grow_loc = statistics.median(r["rss_peak"] - r["rss_before"] for r in loc)
        rep.emit(
            f"peak RSS reading from the S3 server, {mode}",
            peak_srv / 2**20,
            "MiB",
            baseline=peak_loc / 2**20,
            baseline_name="the same from local disk",
            growth_mib=round(grow_srv / 2**20, 1),
            baseline_growth_mib=round(grow_loc / 2**20, 1),
            log_mib=round(log_bytes / 2**20, 1),
        )
        cpu_reader = _median(srv, "cpu_s")
        cpu_server = _median(srv, "server_cpu_s")
        seconds = _median(srv, "seconds")
        amplification = fetched / log_bytes
        rep.emit(
            f"bytes fetched from the S3 server over the log's bytes, {mode}",
            amplification,
            "x",
            log_bytes=log_bytes,
            fetched_bytes=int(fetched),
            get_requests=int(requests),
        )
        rep.emit(
            f"CPU seconds of a read from the S3 server, {mode}",
            cpu_reader + cpu_server,
            "s",
            baseline=_median(loc, "cpu_s"),
            baseline_name="the reading process's, from local disk",
            reader_cpu_s=round(cpu_reader, 2),
            server_cpu_s=round(cpu_server, 2),
            wall_s=round(seconds, 2),
            cores_busy=round((cpu_reader + cpu_server) / seconds, 2),
            # the rows/s ratio were the reads bound by the CPUs they share: baseline / value
            cpu_bound_ratio=round(_median(loc, "cpu_s") / (cpu_reader + cpu_server), 3),
        )
        figures["read"][mode] = {
            "rows": rows,
            "log_bytes": log_bytes,
            "block_size": m.block_size,
            "s3fs_block_size": m.s3_block,
            "threads": threads,
            "local_rows_s": round(loc_rate),
            "server_rows_s": round(srv_rate),
            "ratio": round(srv_rate / loc_rate, 3),
            "local_peak_rss_mib": round(peak_loc / 2**20, 1),
            "server_peak_rss_mib": round(peak_srv / 2**20, 1),
            "local_rss_growth_mib": round(grow_loc / 2**20, 1),
            "server_rss_growth_mib": round(grow_srv / 2**20, 1),
            "fetched_over_log": round(amplification, 3),
            "get_requests": int(requests),
            "server_reader_cpu_s": round(cpu_reader, 2),
            "server_moto_cpu_s": round(cpu_server, 2),
            "local_reader_cpu_s": round(_median(loc, "cpu_s"), 2),
            "cpu_bound_ratio": round(_median(loc, "cpu_s") / (cpu_reader + cpu_server), 3),
            "server_cores_busy": round((cpu_reader + cpu_server) / seconds, 2),
            "server_seconds": round(seconds, 2),
            "local_seconds": round(_median(loc, "seconds"), 2),
            "runs": runs,
            "load": load,
        }


def measure_raw(
    rep: Reporter,
    figures: dict[str, Any],
    server: Server,
    local: Path,
    repeat: int,
    block_size: int,
) -> None:
    """moto's GET throughput of the day's objects (whole, s3fs ``cat_file``) against reading
    the local files whole; and of the same bytes in ranges of ``block_size``, one GET each
    (moto reads the whole object for every range it serves)."""
    files = log_files(local)
    total = sum(p.stat().st_size for p in files)
    keys = [f"{BUCKET}/day/{p.relative_to(local).as_posix()}" for p in files]
    fs = server.fs()
    ranges = [
        (k, a, min(a + block_size, p.stat().st_size))
        for k, p in zip(keys, files, strict=True)
        for a in range(0, p.stat().st_size, block_size)
    ]

    def get_ranges() -> int:
        got = sum(len(fs.cat_file(k, start=a, end=b)) for k, a, b in ranges)
        assert got == total
        return got

    def get(concurrency: int) -> float:
        with ThreadPoolExecutor(concurrency) as pool:
            got = sum(pool.map(lambda k: len(fs.cat_file(k)), keys))
        assert got == total
        return got

    def read_local() -> int:
        return sum(len(p.read_bytes()) for p in files)

    kinds = {
        "get1": lambda: get(1),
        "get2": lambda: get(2),
        "ranges": get_ranges,
        "local": read_local,
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}  # the server's
    client: dict[str, list[float]] = {k: [] for k in kinds}  # this process's (s3fs, botocore)
    get(1)  # the connection pool, the first requests
    for _ in range(repeat):
        for k, fn in kinds.items():
            c0, p0 = server.cpu_seconds(), time.process_time()
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
            cpu[k].append(server.cpu_seconds() - c0)
            client[k].append(time.process_time() - p0)
    rates = {k: total / statistics.median(v) / 1e6 for k, v in times.items()}
    moto_cpu_per_gb = statistics.median(cpu["get1"]) / (total / 1e9)
    client_cpu_per_gb = statistics.median(client["get1"]) / (total / 1e9)
    range_cpu_per_gb = statistics.median(cpu["ranges"]) / (total / 1e9)
    for k, name in (("get1", "one GET at a time"), ("get2", "two GETs at once")):
        rep.emit(
            f"moto raw GET throughput, s3fs cat_file, {name}",
            rates[k],
            "MB/s",
            baseline=rates["local"],
            baseline_name="reading the local files whole",
            bytes=total,
            objects=len(keys),
        )
    from dask.utils import format_bytes

    rep.emit(
        f"moto raw GET throughput, s3fs cat_file, ranges of {format_bytes(block_size)}",
        rates["ranges"],
        "MB/s",
        baseline=rates["get1"],
        baseline_name="the same objects whole, one GET at a time",
        requests=len(ranges),
        moto_cpu_s_per_gb=round(range_cpu_per_gb, 2),
    )
    rep.emit(
        "moto CPU seconds to serve 1 GB (one GET at a time)",
        moto_cpu_per_gb,
        "s",
        client_cpu_s=round(client_cpu_per_gb, 2),
    )
    figures["raw_get"] = {
        "bytes": total,
        "objects": len(keys),
        "get_1_mb_s": round(rates["get1"], 1),
        "get_2_mb_s": round(rates["get2"], 1),
        "range_block_size": block_size,
        "range_requests": len(ranges),
        "range_mb_s": round(rates["ranges"], 1),
        "range_moto_cpu_s_per_gb": round(range_cpu_per_gb, 2),
        "local_read_mb_s": round(rates["local"], 1),
        "moto_cpu_s_per_gb": round(moto_cpu_per_gb, 2),
        "client_cpu_s_per_gb": round(client_cpu_per_gb, 2),
        "load": round(os.getloadavg()[0], 2),
    }


def bound(rep: Reporter, figures: dict[str, Any]) -> None:
    """The server's read against what moto's throughput allows: the bytes it fetched at
    moto's raw GET rate (two at once, as the reader's two threads) take ``fetch_s``; the read
    can take no less than the longer of that and the local read (fetching wholly overlapped
    with parsing, the baseline), and takes about their sum where they do not overlap."""
    rate = figures["raw_get"]["get_2_mb_s"] * 1e6
    for mode, f in figures["read"].items():
        fetch_s = f["fetched_over_log"] * f["log_bytes"] / rate
        f["fetch_s"] = round(fetch_s, 2)
        f["overlapped_s"] = round(max(f["local_seconds"], fetch_s), 2)
        f["serial_s"] = round(f["local_seconds"] + fetch_s, 2)
        rep.emit(
            f"read from the S3 server, {mode}: seconds",
            f["server_seconds"],
            "s",
            baseline=f["overlapped_s"],
            baseline_name="the longer of the local read and the fetch at moto's raw GET rate",
            fetch_s=f["fetch_s"],
            local_s=f["local_seconds"],
            serial_s=f["serial_s"],
        )


def train_config(
    tmp: Path, name: str, where: str, args: argparse.Namespace, server: Server | None
) -> dict[str, Any]:
    """The quickstart's model and table (DLRM, dim 16, Adagrad) on 2 workers of 3 GiB, no
    holdout; a device tier large enough for two passes' keys."""
    cfg: dict[str, Any] = {
        "run": {"name": name, "dir": str(tmp / "runs" / name), "seed": 0, "quiet": True},
        "data": {
            "train": {"paths": [where]},
            "holdout": None,
            "block_size": args.block_size,
        },
        "passes": {
            "epochs": 1,
            "examples_per_pass": args.pass_rows,
            "global_batch_size": args.batch,
            "num_shards": 16,
        },
        "table": {
            "dim": 16,
            "optimizer": {"kind": "adagrad", "lr": 0.05},
            # a pass of 100k rows stages up to 1.3M keys on a worker: two passes' keys fit the
            # device tier (3.2M rows), so a pass is staged while the one before it trains
            "tiers": {"device": {"fraction": 0.2}, "host": {"fraction": 0.05}},
        },
        "model": {"name": "dlrm", "options": {"bottom_mlp": [64, 16], "top_mlp": [64, 32]}},
        "dense_optimizer": {"kind": "adam", "lr": 1.0e-3},
        "cluster": {
            "n_workers": 2,
            "threads_per_worker": 2,
            "memory_limit": "3GiB",
            "gpu": False,
            "dashboard_address": "127.0.0.1:0",
        },
    }
    if server is not None:
        cfg["storage"] = {"options": server.options}
    return cfg


def train_once(cfg: dict[str, Any]) -> dict[str, Any]:
    import daskhps
    from daskhps.config import RunConfig

    t0 = time.perf_counter()
    result = daskhps.train(RunConfig.from_dict(cfg, source="bench_object_store"), progress=False)
    wall = time.perf_counter() - t0
    metrics = [
        json.loads(line)
        for line in (Path(cfg["run"]["dir"]) / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert len(metrics) == len(result.passes)
    steady = metrics[1:] or metrics  # the first pass warms the workers
    examples = sum(p["examples"] for p in metrics)
    return {
        "passes": len(metrics),
        "examples": examples,
        "examples_per_s": statistics.median(p["examples_per_s"] for p in steady),
        "train_s": statistics.median(p["seconds"]["train"] for p in steady),
        "wall_s": wall,
        "wall_examples_per_s": examples / wall,
        "final_train_loss": metrics[-1]["train_loss"],
    }


def measure_training(
    rep: Reporter,
    figures: dict[str, Any],
    server: Server,
    tmp: Path,
    args: argparse.Namespace,
) -> None:
    from daskhps.data.synthetic import GeneratorConfig, generate

    local = tmp / "train-day"
    generate(
        GeneratorConfig(
            days=1, rows_per_day=args.train_rows, parts_per_day=args.parts, seed=1,
            vocab_scale=0.1,
        ),
        local,
    )  # fmt: skip
    url = upload(server, local, "train-day")
    runs: dict[str, list[dict]] = {"local": [], "server": []}
    for r in range(args.train_rounds):
        sides = ("local", "server") if r % 2 == 0 else ("server", "local")
        for side in sides:
            where, srv = (str(local), None) if side == "local" else (url, server)
            cfg = train_config(tmp, f"{side}-{r}", where, args, srv)
            runs[side].append(train_once(cfg))
    loc, srv_runs = runs["local"], runs["server"]
    if srv_runs[0]["final_train_loss"] != loc[0]["final_train_loss"]:
        print(
            "bench_object_store: the runs from the server and from disk ended on different "
            f"losses ({srv_runs[0]['final_train_loss']} and {loc[0]['final_train_loss']})",
            flush=True,
        )
    load = round(os.getloadavg()[0], 2)
    med = {s: {k: _median(v, k) for k in v[0]} for s, v in runs.items()}
    common = {
        "rows": args.train_rows,
        "passes": loc[0]["passes"],
        "examples_per_pass": args.pass_rows,
        "load": load,
    }
    rep.emit(
        "training examples/s (metrics.jsonl), logs on the S3 server",
        med["server"]["examples_per_s"],
        "examples/s",
        baseline=med["local"]["examples_per_s"],
        baseline_name="the same run from local disk",
        train_s=round(med["server"]["train_s"], 2),
        baseline_train_s=round(med["local"]["train_s"], 2),
        runs=[round(r["examples_per_s"]) for r in srv_runs],
        baseline_runs=[round(r["examples_per_s"]) for r in loc],
        **common,
    )
    rep.emit(
        "whole run examples/s (wall, cluster start included), logs on the S3 server",
        med["server"]["wall_examples_per_s"],
        "examples/s",
        baseline=med["local"]["wall_examples_per_s"],
        baseline_name="the same run from local disk",
        wall_s=round(med["server"]["wall_s"], 1),
        baseline_wall_s=round(med["local"]["wall_s"], 1),
    )
    figures["train"] = {
        **common,
        "block_size": args.block_size,
        "batch": args.batch,
        "local": med["local"],
        "server": med["server"],
        "ratio_examples_per_s": round(
            med["server"]["examples_per_s"] / med["local"]["examples_per_s"], 3
        ),
        "ratio_wall": round(
            med["server"]["wall_examples_per_s"] / med["local"]["wall_examples_per_s"], 3
        ),
        "runs": runs,
    }


def table(figures: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    from dask.utils import format_bytes

    rows = [("figure", "local disk", "S3 server (moto)", "server / local")]
    for mode, f in figures["read"].items():
        rows.append(
            (
                f"read {f['rows']:,} rows, {mode}: rows/s",
                f"{f['local_rows_s']:,}",
                f"{f['server_rows_s']:,}",
                f"{f['ratio']:.2f}",
            )
        )
        rows.append(
            (
                f"read, {mode}: peak RSS (growth) MiB",
                f"{f['local_peak_rss_mib']:,.0f} ({f['local_rss_growth_mib']:,.0f})",
                f"{f['server_peak_rss_mib']:,.0f} ({f['server_rss_growth_mib']:,.0f})",
                f"{f['server_peak_rss_mib'] / f['local_peak_rss_mib']:.2f}",
            )
        )
        rows.append(
            (
                f"read, {mode}: bytes fetched / log bytes (GETs)",
                "1",
                f"{f['fetched_over_log']:.2f} ({f['get_requests']})",
                "",
            )
        )
        rows.append(
            (
                f"read, {mode}: CPU s (reader + moto); cores busy",
                f"{f['local_reader_cpu_s']:.1f}",
                f"{f['server_reader_cpu_s']:.1f} + {f['server_moto_cpu_s']:.1f}; "
                f"{f['server_cores_busy']:.2f}",
                f"{f['cpu_bound_ratio']:.2f} (CPU s local / server)",
            )
        )
    if "raw_get" in figures:
        g = figures["raw_get"]
        rows.append(
            (
                "raw GET of the day's objects (cat_file), MB/s: 1 / 2 at once",
                f"{g['local_read_mb_s']:,.0f} (read whole)",
                f"{g['get_1_mb_s']:,.0f} / {g['get_2_mb_s']:,.0f}",
                f"{g['get_1_mb_s'] / g['local_read_mb_s']:.2f}",
            )
        )
        rows.append(
            (
                f"raw GETs of ranges of {format_bytes(g['range_block_size'])}, MB/s "
                f"({g['range_requests']} GETs)",
                "",
                f"{g['range_mb_s']:,.0f}",
                f"{g['range_mb_s'] / g['get_1_mb_s']:.2f} of whole GETs",
            )
        )
        rows.append(
            (
                "moto CPU s per GB served: ranges",
                "",
                f"{g['range_moto_cpu_s_per_gb']:.2f}",
                "",
            )
        )
        rows.append(
            (
                "CPU s per GB of raw GETs: moto + client",
                "",
                f"{g['moto_cpu_s_per_gb']:.2f} + {g['client_cpu_s_per_gb']:.2f}",
                "",
            )
        )
        for mode, f in figures["read"].items():
            if "fetch_s" in f:
                rows.append(
                    (
                        f"read, {mode}: s; server: measured [fetch at raw GET rate]",
                        f"{f['local_seconds']:.2f}",
                        f"{f['server_seconds']:.2f} [{f['fetch_s']:.2f}]",
                        f"{f['server_seconds'] / f['overlapped_s']:.2f} of max(local, fetch)",
                    )
                )
    if "train" in figures:
        t = figures["train"]
        loc, srv = t["local"], t["server"]
        rows.append(
            (
                f"training {t['rows']:,} rows, examples/s (metrics.jsonl)",
                f"{loc['examples_per_s']:,.0f}",
                f"{srv['examples_per_s']:,.0f}",
                f"{t['ratio_examples_per_s']:.2f}",
            )
        )
        rows.append(
            (
                "training: whole run examples/s (wall)",
                f"{loc['wall_examples_per_s']:,.0f}",
                f"{srv['wall_examples_per_s']:,.0f}",
                f"{t['ratio_wall']:.2f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not figures)")
    ap.add_argument("--rows", type=int, default=None, help="rows of the read day (default 2M)")
    ap.add_argument("--parts", type=int, default=8, help="files of a day (default 8)")
    ap.add_argument("--block-size", default="16MiB", help="data.block_size (default 16MiB)")
    ap.add_argument(
        "--s3-block-size",
        default="1MiB",
        help="also read the blocks with this s3fs default_block_size (default 1MiB; 0: not)",
    )
    ap.add_argument("--threads", type=int, default=2, help="threads of the threaded scheduler")
    ap.add_argument("--repeat", type=int, default=None, help="rounds of reads (default 3)")
    ap.add_argument(
        "--train-rows", type=int, default=None, help="rows of the trained day (default 500k)"
    )
    ap.add_argument("--pass-rows", type=int, default=None, help="examples a pass (default 100k)")
    ap.add_argument("--batch", type=int, default=4096, help="global batch size")
    ap.add_argument(
        "--train-rounds", type=int, default=None, help="training runs of each side (default 3)"
    )
    ap.add_argument("--no-train", action="store_true", help="reading and raw GETs only")
    ap.add_argument("--results", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--out", default=None, help="folder for the logs and runs (default: temp)")
    ap.add_argument("--keep", action="store_true", help="keep the logs and runs")
    # one read in a fresh process (the script runs itself): not for use by hand
    ap.add_argument("--read-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-block-size", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--child-s3-block-size", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.read_child is not None:
        read_once(
            args.read_child,
            args.child_block_size or None,
            args.threads,
            args.endpoint,
            args.child_s3_block_size or None,
        )
        return
    from dask.utils import parse_bytes

    rows = args.rows or (40_000 if args.quick else 2_000_000)
    repeat = args.repeat or (1 if args.quick else 3)
    args.train_rows = args.train_rows or (20_000 if args.quick else 500_000)
    args.pass_rows = args.pass_rows or (5_000 if args.quick else 100_000)
    args.batch = min(args.batch, args.pass_rows // 4)
    args.train_rounds = args.train_rounds or (1 if args.quick else 3)
    block_size = parse_bytes(args.block_size)
    if args.quick and args.block_size == "16MiB":
        block_size = 256 << 10  # a quick day's files are a few MB: still several blocks each
        args.block_size = block_size

    from dask.utils import format_bytes

    from daskhps.data.synthetic import GeneratorConfig, generate

    blocks = f"blocks of {format_bytes(block_size)}"
    modes = [Mode(blocks, block_size)]
    s3_block = parse_bytes(args.s3_block_size) if args.s3_block_size else 0
    if args.quick and args.s3_block_size == "1MiB":
        s3_block = 64 << 10  # below the quick blocks, as 1 MiB is below 16 MiB
    if s3_block:
        modes.append(
            Mode(f"{blocks}, s3fs blocks of {format_bytes(s3_block)}", block_size, s3_block)
        )
    modes.append(Mode("whole files", None))
    rep = Reporter(args.json)
    tmp = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-objstore-"))
    tmp.mkdir(parents=True, exist_ok=True)
    loads = {"start": list(os.getloadavg())}
    figures: dict[str, Any] = {
        "settings": {
            "rows": rows,
            "parts": args.parts,
            "block_size": block_size,
            "s3fs_block_size": s3_block or None,
            "threads": args.threads,
            "repeat": repeat,
            "train_rows": None if args.no_train else args.train_rows,
            "pass_rows": args.pass_rows,
            "train_rounds": args.train_rounds,
            "quick": args.quick,
        },
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "read": {},
    }
    t_start = time.perf_counter()
    try:
        local = tmp / "day"
        generate(
            GeneratorConfig(
                days=1, rows_per_day=rows, parts_per_day=args.parts, seed=0, vocab_scale=0.1
            ),
            local,
        )
        with s3_server() as server:
            url = upload(server, local, "day")
            measure_reads(rep, figures, server, local, url, rows, modes, args.threads, repeat)
            loads["after_reads"] = list(os.getloadavg())
            measure_raw(rep, figures, server, local, repeat, block_size)
            bound(rep, figures)
            if not args.no_train:
                measure_training(rep, figures, server, tmp, args)
                loads["after_training"] = list(os.getloadavg())
        loads["end"] = list(os.getloadavg())
        figures["load_average"] = {k: [round(x, 2) for x in v] for k, v in loads.items()}
        figures["seconds"] = round(time.perf_counter() - t_start, 1)
        rep.emit(
            "load average (1 min) at the end",
            loads["end"][0],
            "",
            during=[round(v[0], 2) for v in loads.values()],
        )
        if not args.json:
            print()
            print(table(figures))
        if args.results is not None:
            figures["records"] = rep.results
            args.results.write_text(json.dumps(figures, indent=1) + "\n")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

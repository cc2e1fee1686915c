"""Freshness of continuous training: from a chunk landing to ``daskhps serve`` answering with
a version that trained on it.

    python scripts/bench_follow.py [--chunks 6] [--rows 20000] [--json] [--keep DIR]

What it runs, as a user would: ``daskhps generate`` writes ``--chunks`` + 1 parts of
``--rows`` rows each (the quickstart's vocabularies); ``daskhps retrain configs/follow.yaml
--follow`` watches an empty folder (embedded cluster, polling each second) and ``daskhps
serve --model RUN --poll-s 1`` follows its versions. The first part is renamed into the folder
so that a first version exists to serve; then, one at a time, each next part is renamed into
place and the clock runs until a ``POST /predict`` answers with the version whose registry entry
names that part. Between two chunks the script waits until the previous one is served, so each
figure is one chunk's, not a queue's.

Prints each chunk's freshness (every one with ``--every 1``), their median and largest, the
load average beside them, and what the follower holds after each quarter of the chunks against
after the first: the memory of its driver and of its workers (the fork server's processes
included) and the run folder's bytes on disk (versions and stores; ``retrain.keep_versions``
of configs/follow.yaml bounds the versions). A long run (``--chunks 200``) is the soak.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import Reporter

from daskhps.serve.client import ServeClient

ROOT = Path(__file__).resolve().parent.parent
ROW = {"I1": "1", "C1": "68fd1e64"}  # any row: the answer's version is what is measured


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _daskhps(*args: str) -> list[str]:
    return [sys.executable, "-m", "daskhps.cli", *args]


def _version_of(registry: Path, chunk: Path) -> str | None:
    """The published version whose chunk is ``chunk`` (None: not yet)."""
    try:
        data = json.loads(registry.read_text())
    except (OSError, ValueError):
        return None  # not written yet, or being replaced
    for v in data["versions"]:
        if v.get("chunk") == str(chunk):
            return str(v["name"])
    return None


def _wait(what: str, until: float, check: object) -> object:
    while True:
        got = check()  # type: ignore[operator]
        if got:
            return got
        if time.monotonic() > until:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=6, help="chunks measured (after the first)")
    ap.add_argument("--rows", type=int, default=20_000, help="rows per chunk")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it")
    ap.add_argument("--every", type=int, default=1, help="print every Nth chunk's freshness")
    args = ap.parse_args()
    rep = Reporter(args.json)
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-follow-"))
    work.mkdir(parents=True, exist_ok=True)
    src, watched, run = work / "src", work / "logs", work / "run"
    parts = args.chunks + 1
    subprocess.run(
        _daskhps("generate", "--out", str(src), "--days", "1", "--rows-per-day",
                 str(args.rows * parts), "--parts-per-day", str(parts), "--vocab-scale", "0.1"),
        check=True, capture_output=True,
    )  # fmt: skip
    files = sorted((src / "day=2024-01-01").glob("part-*"))
    watched.mkdir()
    log = open(work / "follow.log", "w")  # noqa: SIM115 -- open for the follower's life
    follower = subprocess.Popen(
        _daskhps("retrain", str(ROOT / "configs/follow.yaml"), "--follow",
                 "--set", f"run.dir={run}", "--set", f"data.train.paths=[{watched}]"),
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    registry = run / "versions" / "registry.json"
    served = None
    try:
        os.rename(files[0], watched / files[0].name)
        _wait("the first version", time.monotonic() + 300,
              lambda: _version_of(registry, watched / files[0].name))  # fmt: skip
        port = _port()
        slog = open(work / "serve.log", "w")  # noqa: SIM115
        served = subprocess.Popen(
            _daskhps("serve", "--model", str(run), "--port", str(port), "--poll-s", "1"),
            stdout=slog, stderr=subprocess.STDOUT,
        )  # fmt: skip
        client = ServeClient(f"http://127.0.0.1:{port}")
        _wait("serve to start", time.monotonic() + 300,
              lambda: served.poll() is None and _ready(client))  # fmt: skip
        fresh: list[float] = []
        held: list[tuple[int, int, int, int]] = []  # chunks, driver, workers, disk
        for i, f in enumerate(files[1:]):
            landed = time.monotonic()
            os.rename(f, watched / f.name)
            version = _wait(f"a version of {f.name}", landed + 600,
                            lambda f=f: _version_of(registry, watched / f.name))  # fmt: skip
            _wait(f"serve to answer with {version}", landed + 600,
                  lambda v=version: client.predict([ROW]).version == v)  # fmt: skip
            fresh.append(time.monotonic() - landed)
            if i % args.every == 0:
                rep.emit(f"follow.freshness.{f.name}", fresh[-1], "s", version=version)
            if i in _checkpoints(len(files) - 1):
                held.append((i + 1, *_roles_rss(follower.pid), _disk(run)))
        load = os.getloadavg()[0]
        rep.emit("follow.freshness.median", statistics.median(fresh), "s", load=round(load, 2),
                 chunks=len(fresh), rows=args.rows, goal_s=60)  # fmt: skip
        rep.emit("follow.freshness.max", max(fresh), "s", load=round(load, 2))
        mib = 1 << 20
        first = held[0]
        for chunks, driver, workers, disk in held[1:]:
            load = round(os.getloadavg()[0], 2)
            for role, now, then in (
                ("memory.driver", driver, first[1]),
                ("memory.workers", workers, first[2]),
                ("disk", disk, first[3]),
            ):
                since = "after the first chunk"
                rep.emit(f"follow.{role}.{chunks}", now / mib, "MiB", baseline=then / mib,
                         baseline_name=since, chunks=chunks, load=load)  # fmt: skip
    finally:
        for p in (served, follower):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(120)
                except subprocess.TimeoutExpired:
                    p.kill()
        log.close()
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


def _checkpoints(n: int) -> set[int]:
    """The chunks (0-based) after which memory and disk are read: the first, each quarter,
    the last."""
    return {0, n - 1, *(n * q // 4 - 1 for q in (1, 2, 3) if n * q // 4 > 0)}


def _roles_rss(pid: int) -> tuple[int, int]:
    """Resident bytes of the follower's driver process, and of its Dask workers together
    (the processes below it that run ``distributed``'s worker, the fork server's included)."""
    import psutil

    p = psutil.Process(pid)
    workers = 0
    for q in p.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "resource_tracker" not in " ".join(q.cmdline()):
                workers += q.memory_info().rss
    return p.memory_info().rss, workers


def _disk(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _ready(client: ServeClient) -> bool:
    try:
        return client.ready()
    except OSError:
        return False


if __name__ == "__main__":
    main()

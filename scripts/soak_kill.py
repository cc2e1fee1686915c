"""Soak test: SIGKILL workers, hosts and the driver at random moments of a run; every run must
still end with the model of an uninterrupted one.

    python scripts/soak_kill.py [--json] [--out DIR] [--parts workers,driver]
                                [--kills 10] [--rows-per-day 40000] [--seed 0]
                                [--time-limit-s 3600]
    python scripts/soak_kill.py --hosts 4 [--kills 10] ...     (the hosts part alone; root)

The run is the quickstart (configs/quickstart.yaml) at ``--rows-per-day`` rows a day, in passes
of ``--examples-per-pass`` (32 passes over 2 epochs on 2 workers), each pass checkpointed. First it
trains once uninterrupted on the embedded cluster (the reference). Then, in two parts:

``workers``  a ``dask scheduler`` and 2 ``dask worker --nanny`` processes on 127.0.0.1, and
             ``daskhps train --set cluster.address=...``. ``--kills`` times, each at a random
             moment after the run's next checkpoint since the previous restart (so the run
             moves on between two kills), one random worker process is SIGKILLed; its nanny
             starts it again and the run recovers by itself (``cluster.max_restarts`` covers
             the kills). The killed worker's process group is left alone: the nanny stays.
``driver``   ``daskhps train`` on its embedded cluster, SIGKILLed ``--kills`` times at a
             random moment after its next checkpoint, each followed by ``daskhps train
             --resume``; the last resume runs to the end.
``hosts``    (``--hosts N``) N hosts, each a ``dask worker --nanny`` in a mount namespace of
             its own with a private, empty disk (a tmpfs) at ``table.tiers.store_dir``, and
             ``checkpoint.replicate_to`` on a folder all share. ``--kills`` times, at a random
             moment after the next checkpoint, a random host is lost with its disk (its whole
             process group SIGKILLed) and a new host starts on an empty disk; the run restores
             the lost ranks from the copy onto the new host by itself. The final model is read
             from the copy (the driver sees no host's disk). Needs root (``unshare -m``).

Each part's final checkpoint is compared with the reference: dense weights and every stored
row, bit for bit (the worker count comes back each time). Reported per part: kills made and
survived, the restarts the run recorded, recovery seconds (from the failure to training
again, ``summary.json``'s ``restarts``) for the workers, and for both the wall time against
the reference's. Bounded: ``--kills`` per part, and no part starts once ``--time-limit-s`` has
gone by (a run still going then is stopped, and the part reported as cut short).
Everything stays in ``--out`` (default: a temporary folder, removed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Reporter, cli

from daskhps.runfiles.checkpoint import latest_checkpoint, list_checkpoints

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
WORKERS = 2  # the quickstart's cluster.n_workers; the real cluster gets as many


def _sets(out: Path, name: str, rows: int, per_pass: int) -> list[str]:
    return [
        "--set", f"run.dir={out / name}",
        "--set", f"data.generate.out={out / 'data'}",
        "--set", f"data.generate.rows_per_day={rows}",
        "--set", "data.generate.parts_per_day=2",
        "--set", f"passes.examples_per_pass={per_pass}",
        "--set", "run.quiet=true",
    ]  # fmt: skip


def _train(args: list[str], log: Path) -> subprocess.Popen:
    return cli("train", str(QUICKSTART), *args, log=log)


def _checkpoints(run_dir: Path) -> int:
    """Passes done at the run's newest complete checkpoint (torn ones quietly left out)."""
    done = list_checkpoints(run_dir)
    return done[-1].passes_done if done else 0


def _wait_for(cond: Any, proc: subprocess.Popen, deadline: float) -> bool:
    """Until ``cond()`` (True) or the run ended or the deadline passed (False)."""
    while not cond():
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _same_model(run: Path, reference: Path) -> tuple[bool, str]:
    a, b = latest_checkpoint(run), latest_checkpoint(reference)
    if a is None or b is None or a.passes_done != b.passes_done:
        return False, "no final checkpoint, or not the reference's"
    da, db = a.dense_state(), b.dense_state()
    for k in db:
        if not bool((da[k] == db[k]).all()):
            return False, f"dense {k} differs"
    if a.num_workers != b.num_workers:
        return False, f"{a.num_workers} workers, the reference {b.num_workers}"
    for r in range(b.num_workers):
        with a.open_store(r) as s, b.open_store(r) as t:
            keys = t.keys()
            if not bool((s.keys().sort().values == keys.sort().values).all()):
                return False, f"rank {r}: other keys"
            if not bool((s.lookup(keys).rows == t.lookup(keys).rows).all()):
                return False, f"rank {r}: rows differ"
    return True, "bit-identical"


class _Cluster:
    """``dask scheduler`` and ``dask worker --nanny`` processes on 127.0.0.1; with ``disk``,
    each worker's process group is a host with a private empty tmpfs at ``disk``."""

    def __init__(self, folder: Path, workers: int, disk: Path | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.disk = disk
        self.procs: list[subprocess.Popen] = []
        sched_file = folder / "scheduler.json"
        self._spawn(
            "scheduler",
            ["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(sched_file)],
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"no dask scheduler after 60 s; see {folder / 'scheduler.log'}")
            time.sleep(0.1)
        time.sleep(0.2)
        self.address = json.loads(sched_file.read_text())["address"]
        self.sched_file = sched_file
        self.hosts = workers
        self.nannies = [self._worker(i, sched_file) for i in range(workers)]

    def _worker(self, i: int, sched_file: Path) -> subprocess.Popen:
        argv = ["worker", "--scheduler-file", str(sched_file), "--host", "127.0.0.1",
                "--nthreads", "2", "--memory-limit", "3GiB", "--no-dashboard", "--nanny",
                "--local-directory", str(self.folder / f"worker-{i}")]  # fmt: skip
        return self._spawn(f"worker-{i}", argv, private=self.disk)

    def _spawn(self, name: str, argv: list[str], private: Path | None = None) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "dask", *argv]
        if private is not None:  # a host: its own mount namespace, an empty disk at `private`
            mount = f'mount -t tmpfs none {shlex.quote(str(private))} && exec "$@"'
            cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", mount, "sh", *cmd]
        with open(self.folder / f"{name}.log", "ab") as log:
            p = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
                start_new_session=True,
            )
        self.procs.append(p)
        return p

    def kill_a_worker(self, rng: random.Random) -> int | None:
        """SIGKILL a random worker process (not its nanny, which starts it again), as the
        scheduler knows it; its pid, None when no worker is up right now."""
        from distributed import Client

        with Client(self.address, timeout="30s") as client:
            pids = list(client.run(os.getpid).values())
        if len(pids) < WORKERS:
            return None  # one is being started again right now
        victim = rng.choice(sorted(pids))
        os.kill(victim, signal.SIGKILL)
        return victim

    def lose_a_host(self, rng: random.Random) -> int | None:
        """SIGKILL a random host's whole process group (nanny, worker and, with them, the
        mount namespace holding its disk) and start a new host on an empty disk; the lost
        host's index, None when fewer hosts than the run needs are up."""
        alive = [i for i, p in enumerate(self.nannies) if p.poll() is None]
        if len(alive) < self.hosts:
            return None
        victim = rng.choice(alive)
        os.killpg(self.nannies[victim].pid, signal.SIGKILL)
        self.nannies[victim].wait(30)
        self.nannies.append(self._worker(len(self.nannies), self.sched_file))
        return victim

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _workers_part(out: Path, args: argparse.Namespace, rng: random.Random, deadline: float):
    run_dir = out / "workers"
    cluster = _Cluster(out / "cluster", WORKERS)
    try:
        sets = [*_sets(out, "workers", args.rows_per_day, args.examples_per_pass),
                "--set", f"cluster.address={cluster.address}",
                "--set", f"cluster.max_restarts={args.kills + 1}",
                "--set", "cluster.restart_wait_s=120"]  # fmt: skip
        t0 = time.perf_counter()
        proc = _train(sets, out / "workers.log")
        kills = _kill_during(proc, run_dir, run_dir, cluster.kill_a_worker, args, rng, deadline)
        rc = _finish(proc, deadline)
        seconds = time.perf_counter() - t0
    finally:
        cluster.close()
    summary = _summary(run_dir)
    return rc, seconds, kills, summary


def _kill_during(
    proc: subprocess.Popen,
    run_dir: Path,
    watched: Path,
    kill: Any,
    args: argparse.Namespace,
    rng: random.Random,
    deadline: float,
) -> list[float]:
    """Up to ``args.kills`` times: once ``watched`` (the run folder, or its copy) holds one
    more checkpoint than at the last restart (the run moves on between two kills), at a
    random moment of the next pass, ``kill(rng)``; then wait for the run's restart. The
    seconds from ``proc``'s start of each kill made."""
    t0 = time.perf_counter()
    kills: list[float] = []
    for restarts in range(1, args.kills + 1):
        done = _checkpoints(watched)
        if not _wait_for(lambda d=done: _checkpoints(watched) > d, proc, deadline):
            break
        time.sleep(rng.uniform(0.0, 3.0))
        if proc.poll() is not None or kill(rng) is None:
            break
        kills.append(time.perf_counter() - t0)
        if not _wait_for(lambda n=restarts: _restarts_logged(run_dir) >= n, proc, deadline):
            break
    return kills


def _hosts_part(out: Path, args: argparse.Namespace, rng: random.Random, deadline: float):
    run_dir = out / "hosts"
    disk = out / "disk"  # every host's own tmpfs is mounted here; the driver's side stays empty
    disk.mkdir(parents=True, exist_ok=True)
    cluster = _Cluster(out / "cluster-hosts", args.hosts, disk=disk)
    try:
        sets = [*_sets(out, "hosts", args.rows_per_day, args.examples_per_pass),
                "--set", f"cluster.address={cluster.address}",
                "--set", f"cluster.max_restarts={args.kills + 1}",
                "--set", "cluster.restart_wait_s=120",
                "--set", f"table.tiers.store_dir={disk / 'stores'}",
                "--set", f"checkpoint.replicate_to={out / 'hosts-copy'}"]  # fmt: skip
        t0 = time.perf_counter()
        proc = _train(sets, out / "hosts.log")
        copy = out / "hosts-copy"  # a lost disk comes back from the copy: wait for its next
        kills = _kill_during(proc, run_dir, copy, cluster.lose_a_host, args, rng, deadline)
        rc = _finish(proc, deadline)
        seconds = time.perf_counter() - t0
    finally:
        cluster.close()
    summary = _summary(run_dir)
    summary["driver_wrote_on_the_disk_path"] = sum(1 for _ in disk.rglob("*"))
    return rc, seconds, kills, summary


def _restarts_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum('"restart"' in line for line in path.read_text().splitlines())


def _finish(proc: subprocess.Popen, deadline: float) -> int | None:
    """The run's exit code, or None when it is stopped at the deadline."""
    try:
        return proc.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _stop(proc)
        return None


def _summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _driver_part(out: Path, args: argparse.Namespace, rng: random.Random, deadline: float):
    run_dir = out / "driver"
    sets = _sets(out, "driver", args.rows_per_day, args.examples_per_pass)
    log = out / "driver.log"
    kills: list[float] = []
    t0 = time.perf_counter()
    resume: list[str] = []
    rc: int | None = None
    for _ in range(args.kills):
        done = _checkpoints(run_dir)
        proc = _train([*sets, *resume], log)
        if not _wait_for(lambda d=done: _checkpoints(run_dir) > d, proc, deadline):
            rc = _finish(proc, deadline)
            break
        time.sleep(rng.uniform(0.0, 3.0))
        if proc.poll() is not None:
            rc = proc.returncode
            break
        os.kill(proc.pid, signal.SIGKILL)  # the driver alone: its workers exit by themselves
        proc.wait(30)
        kills.append(time.perf_counter() - t0)
        resume = ["--resume"]
    else:
        rc = _finish(_train([*sets, *resume], log), deadline)
    return rc, time.perf_counter() - t0, kills, {"checkpoints": len(list_checkpoints(run_dir))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--out", type=Path, default=None, help="keep everything in this folder")
    ap.add_argument("--parts", default="workers,driver", help="workers, driver or both")
    ap.add_argument("--kills", type=int, default=10, help="kills per part")
    ap.add_argument("--rows-per-day", type=int, default=80_000)
    ap.add_argument(
        "--examples-per-pass", type=int, default=5_000, help="32 passes: room for the kills"
    )
    ap.add_argument("--seed", type=int, default=0, help="of the kill moments and victims")
    ap.add_argument("--time-limit-s", type=float, default=3600.0)
    ap.add_argument("--hosts", type=int, default=0, help="the hosts part alone, on this many hosts")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if args.hosts:
        if shutil.which("unshare") is None or os.geteuid() != 0:
            raise SystemExit("--hosts: needs root and unshare (a mount namespace per host)")
        parts = ["hosts"]
    if not set(parts) <= {"workers", "driver", "hosts"}:
        raise SystemExit(f"--parts: workers and/or driver, got {args.parts!r}")
    rep = Reporter(args.json)
    rng = random.Random(args.seed)
    deadline = time.monotonic() + args.time_limit_s
    tmp = None
    if args.out is None:
        tmp = tempfile.mkdtemp(prefix="daskhps-soak-")
        out = Path(tmp)
    else:
        out = args.out
        out.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        ref_sets = _sets(out, "reference", args.rows_per_day, args.examples_per_pass)
        if args.hosts:  # as many embedded workers as hosts: the same ranks, the same model
            ref_sets += ["--set", f"cluster.n_workers={args.hosts}"]
        ref = _train(ref_sets, out / "reference.log")
        if ref.wait() != 0:
            raise SystemExit(f"the reference run failed; see {out / 'reference.log'}")
        ref_s = time.perf_counter() - t0
        passes = _checkpoints(out / "reference")
        rep.emit("reference run", ref_s, "s", passes=passes, load=round(os.getloadavg()[0], 2))
        for part in parts:
            if time.monotonic() > deadline:
                rep.emit(f"{part}: not started (time limit)", 0, "kills")
                continue
            fn = {"workers": _workers_part, "driver": _driver_part, "hosts": _hosts_part}[part]
            rc, seconds, kills, summary = fn(out, args, rng, deadline)
            # the hosts' disks are gone: their final model is read from the copy
            final = out / ("hosts-copy" if part == "hosts" else part)
            same, why = _same_model(final, out / "reference")
            rep.emit(
                f"{part}: kills survived",
                len(kills) if same and rc == 0 else 0,
                "kills",
                made=len(kills),
                exit=rc,
                model=why,
            )
            rep.emit(f"{part}: wall time", seconds, "s", baseline=ref_s, baseline_name="reference")
            if part == "hosts":
                rep.emit(
                    "hosts: files the driver wrote at the hosts' store path",
                    summary.get("driver_wrote_on_the_disk_path", 0),
                    "files",
                )
            if part in ("workers", "hosts"):
                restarts = summary.get("restarts", [])
                recovery = [float(r["seconds"]) for r in restarts]
                rep.emit(
                    f"{part}: restarts recorded",
                    len(restarts),
                    "restarts",
                    recovery_median_s=round(statistics.median(recovery), 2) if recovery else None,
                    recovery_max_s=round(max(recovery), 2) if recovery else None,
                    waited_median_s=round(
                        statistics.median(float(r["waited_s"]) for r in restarts), 2
                    )
                    if restarts
                    else None,
                )
            else:
                extra = (seconds - ref_s) / len(kills) if kills else 0.0
                rep.emit("driver: seconds a kill and resume add", extra, "s")
        rep.emit("load average (1 min) at the end", os.getloadavg()[0], "")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

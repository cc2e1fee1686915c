"""A real Dask cluster on 127.0.0.1 for tests: a ``dask scheduler`` process and ``dask worker``
processes, as an operator starts them (docs/operations.md), not a LocalCluster.

::

    with RealCluster(tmp_path, workers=2) as cluster:
        main(["train", "run.yaml", "--set", f"cluster.address={cluster.address}"])
        cluster.kill_worker(0)   # SIGKILL: a lost machine
        cluster.add_worker()     # a replacement joins

Every process is started in its own session and killed (the whole group) when the block ends,
whatever happened in it. Their output goes to ``<folder>/<name>.log``, which a failing test's
message can name.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self

from tests._signals import default_dispositions

__all__ = ["RealCluster"]

_SCHEDULER = [sys.executable, "-m", "dask", "scheduler"]  # the `dask scheduler` command
_WORKER = [sys.executable, "-m", "dask", "worker"]  # the `dask worker` command


class RealCluster:
    def __init__(
        self,
        folder: Path,
        workers: int = 2,
        *,
        threads: int = 2,
        memory_limit: str = "2GiB",
        nanny: bool = True,
        timeout_s: float = 60.0,
        tls: Any = None,
        cwd: Path | None = None,
        hide: Path | None = None,
        readonly: tuple[Path, ...] = (),
        hide_size: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.folder = Path(folder)
        self.cwd = cwd  # the folder the workers start in (default: this process's)
        # a folder the workers do not see: an empty tmpfs over it in a mount namespace of
        # their own, as on a host without the driver's disk
        self.hide = hide
        self.readonly = readonly  # folders the workers see read-only (with ``hide``)
        self.hide_size = hide_size  # the tmpfs's size (mount's size=): a disk that can fill
        self.folder.mkdir(parents=True, exist_ok=True)
        self.threads, self.memory_limit, self.nanny = threads, memory_limit, nanny
        self.timeout_s = timeout_s
        self.tls = tls  # tests._tls.TLSFiles: every process speaks tls:// with these files
        self.scheduler_file = self.folder / "scheduler.json"
        self._env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            # the profile history daskhps's own clusters keep (docs/operations.md)
            "DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH": "120",
            **(env or {}),
        }
        self.workers: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []
        self.scheduler = self._spawn(
            "scheduler",
            [*_SCHEDULER, "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(self.scheduler_file), *self._tls_args(scheduler=True)],
        )  # fmt: skip
        try:
            self.address = self._wait_scheduler()
            for _ in range(workers):
                self.add_worker(wait=False)
            self.wait_for_workers(workers)
        except BaseException:
            self.close()
            raise

    def _spawn(
        self, name: str, argv: list[str], cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.folder / f"{name}.log", "ab")  # noqa: SIM115 -- open while it runs
        self._logs.append(log)
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._env,
            start_new_session=True,
            cwd=cwd,
            preexec_fn=default_dispositions,  # stopped by SIGTERM, whatever the suite inherited
        )

    def _wait_scheduler(self) -> str:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.scheduler.poll() is not None:
                raise RuntimeError(f"dask scheduler exited; see {self.folder / 'scheduler.log'}")
            try:
                return str(json.loads(self.scheduler_file.read_text())["address"])
            except (OSError, ValueError, KeyError):
                time.sleep(0.1)
        raise TimeoutError(f"no dask scheduler after {self.timeout_s:g} s")

    def add_worker(self, wait: bool = True) -> None:
        """Start one more ``dask worker`` process (with its nanny unless ``nanny=False``)."""
        i = len(self.workers)
        argv = [*_WORKER, "--scheduler-file", str(self.scheduler_file), "--host", "127.0.0.1",
                "--nthreads", str(self.threads), "--memory-limit", self.memory_limit,
                "--no-dashboard", "--local-directory", str(self.folder / f"worker-{i}"),
                "--nanny" if self.nanny else "--no-nanny", *self._tls_args()]  # fmt: skip
        self.workers.append(self._spawn(f"worker-{i}", self._on_host(i, argv), self.cwd))
        if wait:
            self.wait_for_workers(self.alive())

    def _hidden_mount(self, i: int) -> str:
        """The shell command that puts worker ``i``'s own disk over ``hide``: an empty tmpfs."""
        assert self.hide is not None
        size = f"-o size={self.hide_size} " if self.hide_size else ""
        return f"mount -t tmpfs {size}none {shlex.quote(str(self.hide))}"

    def _on_host(self, i: int, argv: list[str]) -> list[str]:
        """Worker ``i``'s command, in a mount namespace of its own when ``hide`` is set."""
        if self.hide is None:
            return argv
        mount = self._hidden_mount(i)
        for ro in map(shlex.quote, map(str, self.readonly)):
            mount += f" && mount --bind {ro} {ro} && mount -o remount,bind,ro {ro}"
        mount += ' && exec "$@"'
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", mount, "sh", *argv]

    def _tls_args(self, scheduler: bool = False) -> list[str]:
        if self.tls is None:
            return []
        t = self.tls
        files = ["--tls-ca-file", str(t.ca_file), "--tls-cert", str(t.cert_file),
                 "--tls-key", str(t.key_file)]  # fmt: skip
        return (["--protocol", "tls"] if scheduler else []) + files

    def client(self) -> Any:
        from distributed import Client, Security

        security = None
        if self.tls is not None:
            security = Security(
                tls_ca_file=str(self.tls.ca_file),
                tls_client_cert=str(self.tls.cert_file),
                tls_client_key=str(self.tls.key_file),
                require_encryption=True,
            )
        return Client(self.address, timeout=self.timeout_s, security=security)

    def alive(self) -> int:
        return sum(1 for w in self.workers if w.poll() is None)

    def wait_for_workers(self, n: int) -> None:
        if n < 1:
            return
        with self.client() as client:
            client.wait_for_workers(n, timeout=self.timeout_s)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker process ``i`` and its nanny: the machine is gone."""
        os.killpg(self.workers[i].pid, signal.SIGKILL)
        self.workers[i].wait(30)

    def close(self) -> None:
        for p in [*self.workers, self.scheduler]:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for p in [*self.workers, self.scheduler]:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        for log in self._logs:
            log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""``mid_pass`` kills the driver once the pass's tasks have started on every worker, however
short they are: a look for tasks that run at that moment missed passes whose tasks ran
between two looks (a worker's event loop answers late while its task holds the interpreter,
on a loaded machine), and the run then finished instead of dying. A task of an earlier pass
still held on a worker does not count."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from daskhps.training.killpoints import ENV

_DRIVER = """
    import sys, time
    from distributed import Client, LocalCluster
    from daskhps.training.killpoints import kill_when_running

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        workers = list(client.scheduler_info()["workers"])
        # an earlier pass's task, its result still held
        earlier = client.submit(lambda: 0, key="daskhps-train-pass-0-1", workers=workers[:1])
        earlier.result()
        disarm = kill_when_running(client, "daskhps-train-pass-", 2, position=0)
        time.sleep(1.0)
        print("alive after the earlier pass's task", flush=True)
        # this pass: one task a worker, each over long before a look could find it running
        now = [client.submit(lambda r=r: r, key=f"daskhps-train-pass-{r}-2", workers=[w])
               for r, w in enumerate(workers)]
        client.gather(now)
        time.sleep(3.0)
        disarm()
        print("not killed", flush=True)
"""


def test_a_pass_of_short_tasks_is_killed_and_an_earlier_passs_task_is_not_counted() -> None:
    env = {**os.environ, ENV: "mid_pass:0"}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_DRIVER)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert "alive after the earlier pass's task" in out.stdout, out.stderr[-2000:]
    assert "not killed" not in out.stdout
    assert out.returncode == -9, (out.returncode, out.stderr[-2000:])

"""The dashboard's JSON pages answer while tasks run, on a cluster started as training starts
one (in-process workers here: the pages are the scheduler's, and the scheduler always runs in
the driver's process)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from distributed import Future

from daskhps.distributed import start_cluster
from daskhps.distributed._dashboard import json_safe
from daskhps.distributed.cluster import ClusterHandle
from daskhps.stages import stage_span

pytest.importorskip("bokeh")  # the dashboard, whose static routes /sitemap.json walks


def _metered(i: int) -> int:
    with stage_span("train"):  # a daskhps stage label in the Fine Performance Metrics
        time.sleep(0.02)
    return i


@pytest.fixture()
def busy() -> Iterator[tuple[ClusterHandle, list[Future]]]:
    with start_cluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0"
    ) as handle:
        futures = [handle.client.submit(_metered, i, pure=False) for i in range(300)]
        try:
            yield handle, futures
        finally:
            handle.client.cancel(futures)


def _tuple_keys_in_last_heartbeat(dask_scheduler: Any) -> bool:
    return any(
        isinstance(k, tuple)
        for ws in dask_scheduler.workers.values()
        for k in ws.metrics.get("digests_total_since_heartbeat", {})
    )


def _get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, None


@pytest.mark.slow
def test_identity_and_sitemap_answer_valid_json_while_tasks_run(busy) -> None:
    handle, _ = busy
    port = handle.cluster.scheduler.http_server.port
    # Wait for a heartbeat that carries the tasks' metrics, keyed by tuples: the case that
    # broke identity.json (tasks run for 6 s, so every later heartbeat carries them too).
    deadline = time.monotonic() + 20
    while not handle.client.run_on_scheduler(_tuple_keys_in_last_heartbeat):
        assert time.monotonic() < deadline, "no heartbeat with the tasks' metrics"
        time.sleep(0.1)
    status, identity = _get(port, "/json/identity.json")
    assert status == 200
    (worker,) = identity["workers"].values()
    keys = worker["metrics"]["digests_total_since_heartbeat"]
    assert any(k.startswith("execute/metered/") for k in keys), keys  # tuple keys, joined
    status, sitemap = _get(port, "/sitemap.json")
    assert status == 200
    assert {"/json/identity.json", "/status/?", "/sitemap.json"} <= set(sitemap["paths"])


def test_json_safe_joins_tuple_keys_at_any_depth() -> None:
    got = json_safe({"a": {("execute", None, "x", "seconds"): 1.5, 3: [{(1, 2): "v"}]}})
    assert got == {"a": {"execute/None/x/seconds": 1.5, 3: [{"1/2": "v"}]}}
    assert json.loads(json.dumps(got))

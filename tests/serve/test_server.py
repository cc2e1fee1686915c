"""``daskhps serve`` on 127.0.0.1: real HTTP requests to a real tornado server over the real
training run's checkpoints (tests/serve/conftest.py), every answer checked against the scores
computed without the serving code.

The refresh tests build a real version registry from the run's two checkpoints (v1 = pass 1,
v2 = pass 2) and move ``CURRENT`` as ``retrain`` and ``--rollback`` do.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import tornado.netutil

from daskhps.retrain.versions import Registry
from daskhps.runfiles.checkpoint import list_checkpoints
from daskhps.serve.client import ServeClient
from daskhps.serve.server import ServeOptions
from tests._runs import cli_here
from tests._signals import default_dispositions
from tests.serve.helpers import Running, publish_checkpoint, tree_state

pytestmark = pytest.mark.slow

SCHEMA_COLUMNS = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]


def _rows(frame: pd.DataFrame, raw: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "label" and v == v} for r in raw.to_dict("records")]


def _raw(files: list[str]) -> pd.DataFrame:
    """The holdout's log lines as text fields (what a caller holds), label column included."""
    parts = [
        pd.read_csv(
            f, sep="\t", header=None, names=SCHEMA_COLUMNS, dtype=str, keep_default_na=False
        )
        for f in files
    ]
    raw = pd.concat(parts, ignore_index=True)
    return raw.replace("", np.nan)


@pytest.fixture(scope="module")
def raw(run: dict[str, Any]) -> pd.DataFrame:
    return _raw(run["holdout"])


@pytest.fixture(scope="module")
def served(run: dict[str, Any]) -> Iterator[Running]:
    """The run directory served as it is (its latest checkpoint)."""
    r = Running(ServeOptions(model=run["cfg"].run.dir, device_rows=2000, host_bytes=1 << 20))
    yield r
    r.close()


def test_json_rows_score_as_the_trainer_does(
    served: Running, run: dict[str, Any], raw: pd.DataFrame
) -> None:
    rows = _rows(run["frame"], raw)
    got = served.client.predict(rows[:1000])
    assert got.version == list_checkpoints(run["cfg"].run.dir)[-1].name
    assert np.abs(np.array(got.probabilities) - run["reference"][:1000]).max() < 1e-6
    # numbers where the log has digits: the same keys and values as the text
    as_numbers = [
        {k: (int(v) if k.startswith("I") else v) for k, v in r.items()} for r in rows[:50]
    ]
    again = served.client.predict(as_numbers)
    assert np.abs(np.array(again.probabilities) - run["reference"][:50]).max() < 1e-6


def test_log_lines_with_and_without_the_label(
    served: Running, run: dict[str, Any], raw: pd.DataFrame
) -> None:
    text = Path(run["holdout"][0]).read_text()
    n = text.count("\n")
    with_label = served.client.predict_lines(text)
    assert np.abs(np.array(with_label.probabilities) - run["reference"][:n]).max() < 1e-6
    unlabelled = "".join(line.split("\t", 1)[1] + "\n" for line in text.splitlines()[:200])
    without = served.client.predict_lines(unlabelled)
    assert np.abs(np.array(without.probabilities) - run["reference"][:200]).max() < 1e-6


BAD = [
    (b"{not json", "application/json", 400, "not valid JSON"),
    (b'{"rows": []}', "application/json", 400, "empty batch"),
    (b'{"rows": [{"I1": 1}], "extra": 1}', "application/json", 400, "unknown key 'extra'"),
    (b'{"rows": [{"I1": 1}, {"C99": "a"}]}', "application/json", 400, "row 1: unknown field 'C99'"),
    (b'{"rows": [{"I1": 1}, {"I2": [1]}]}', "application/json", 400, "row 1: field 'I2': expected"),
    (b'{"rows": [{"C3": 1.5}]}', "application/json", 400, "row 0: field 'C3': expected a string"),
    (b'{"rows": [{"I1": 1}, {"I4": "abc"}]}', "application/json", 400, "row 1: dense column I4"),
    (b'{"rows": [3]}', "application/json", 400, "row 0: expected an object"),
    (b"1\t2\n", "text/tab-separated-values", 400, "body: line 1: "),
    (b"a,b\n", "text/csv", 415, "this model reads tsv logs"),
    (b"<x/>", "application/xml", 415, "unsupported Content-Type"),
]


@pytest.mark.parametrize(("body", "kind", "status", "words"), BAD, ids=[b[3] for b in BAD])
def test_bad_requests_are_4xx_naming_row_and_field(
    served: Running, body: bytes, kind: str, status: int, words: str
) -> None:
    code, data = served.client.request("POST", "/predict", body, kind)
    assert code == status, data
    assert words in json.loads(data)["error"], data
    assert served.client.predict([{"I1": 1}]).version  # and it keeps serving


def test_limits_health_and_metrics(served: Running, run: dict[str, Any]) -> None:
    code, data = served.client.request("POST", "/predict", b" " * (65 << 20), "application/json")
    assert code == 413 and b"over the limit" in data
    too_many = json.dumps({"rows": [{"I1": 1}] * 65537}).encode()
    code, data = served.client.request("POST", "/predict", too_many, "application/json")
    assert code == 413 and b"limit of 65536 rows" in data
    assert served.client.request("GET", "/healthz")[0] == 200
    assert json.loads(served.client.request("GET", "/readyz")[1])["status"] == "ready"
    text = served.client.metrics()
    assert 'daskhps_serve_request_seconds_count{batch="1"}' in text
    assert 'daskhps_serve_requests_total{code="400"}' in text
    for tier in ("device", "host", "store", "init"):
        assert f'daskhps_serve_hit_rate{{tier="{tier}"}}' in text
    assert f'version="{served.server.version}"' in text
    rows = [
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("daskhps_serve_rows_total")
    ]
    assert rows and rows[0] > 1000


def test_an_unknown_path_is_a_json_404_naming_the_paths(served: Running) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    try:
        conn.request("GET", "/predcit")
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    assert resp.status == 404 and resp.getheader("Content-Type") == "application/json", data
    error = json.loads(data)["error"]
    assert error.startswith("no such path: GET /predcit;") and "POST /predict" in error


def test_a_chunked_body_over_the_limit_is_a_413(served: Running) -> None:
    """100 MB without a Content-Length (``Transfer-Encoding: chunked``), over the 64 MiB limit:
    the same 413 as a body that declares its length, not tornado's bare 400."""
    piece = b" " * (1 << 20)
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=120)
    try:
        conn.request(
            "POST",
            "/predict",
            body=(piece for _ in range(100)),
            headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
            encode_chunked=True,
        )
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    assert resp.status == 413, (resp.status, data[:200])
    assert "over the limit of 67108864 bytes" in json.loads(data)["error"]
    assert served.client.predict([{"I1": 1}]).version  # and it keeps serving


@pytest.fixture()
def registry(run: dict[str, Any], tmp_path: Path) -> tuple[Registry, list[Any]]:
    """A retraining run's registry with v000001 = pass 1 current."""
    folder = tmp_path / "retrain" / "versions"
    ckpts = list_checkpoints(run["cfg"].run.dir)
    reg = Registry(folder)
    publish_checkpoint(reg, "v000001", ckpts[0])
    return reg, ckpts


def _reference_of(run: dict[str, Any], version: str, folder: Path) -> np.ndarray:
    from daskhps.serve import load_servable
    from daskhps.serve.score import CacheSizes, Scorer

    scorer = Scorer(load_servable(folder / version), CacheSizes(device_rows=100_000, host_bytes=0))
    try:
        return scorer.score(run["frame"])
    finally:
        scorer.close()


def test_it_follows_current_through_publish_and_rollback_without_a_failed_request(
    run: dict[str, Any], raw: pd.DataFrame, registry: tuple[Registry, list[Any]]
) -> None:
    reg, ckpts = registry
    folder = reg.folder
    r = Running(ServeOptions(model=str(folder.parent), device_rows=500, host_bytes=0, poll_s=3600))
    rows = _rows(run["frame"], raw)[:300]
    answers: list[Any] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def load() -> None:
        with ServeClient(f"http://127.0.0.1:{r.port}") as c:
            while not stop.is_set():
                try:
                    answers.append(c.predict(rows))
                except BaseException as e:
                    failures.append(e)

    try:
        assert r.client.predict(rows[:1]).version == "v000001"
        assert r.refresh() is None  # CURRENT unchanged: nothing moves
        loader = threading.Thread(target=load)
        loader.start()
        time.sleep(0.5)
        publish_checkpoint(reg, "v000002", ckpts[1])
        swap = r.refresh()
        assert (swap.old, swap.new, swap.how) == ("v000001", "v000002", "diff")
        time.sleep(0.5)
        reg.rollback("v000001")
        back = r.refresh()
        assert (back.new, back.how) == ("v000001", "diff")
        time.sleep(0.5)
        stop.set()
        loader.join(60)
    finally:
        stop.set()
        r.close()
    assert not failures, failures[:3]
    versions = [a.version for a in answers]
    assert {"v000001", "v000002"} <= set(versions), versions
    refs = {v: _reference_of(run, v, folder)[:300] for v in ("v000001", "v000002")}
    assert np.abs(refs["v000001"] - refs["v000002"]).max() > 1e-4  # the versions differ
    for a in answers:  # each answer wholly of the version it names: none mixes two
        assert np.abs(np.array(a.probabilities) - refs[a.version]).max() < 1e-6


def _serve_cli(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "daskhps.cli", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_dispositions,  # stopped by SIGTERM, whatever the suite inherited
    )


def _free_port() -> int:
    s = tornado.netutil.bind_sockets(0, "127.0.0.1")[0]
    port = s.getsockname()[1]
    s.close()
    return port


def test_two_processes_on_one_port(run: dict[str, Any], raw: pd.DataFrame) -> None:
    port = _free_port()
    proc = _serve_cli(
        ["--model", run["cfg"].run.dir, "--port", str(port), "--processes", "2", "--device-rows",
         "2000", "--host-mb", "1"]
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        pids: set[str] = set()
        rows = _rows(run["frame"], raw)[:20]
        deadline = time.monotonic() + 120
        while len(pids) < 2 and time.monotonic() < deadline:
            with ServeClient(url) as c:  # a new connection: the kernel picks a process
                if not c.ready():
                    time.sleep(0.2)
                    continue
                got = c.predict(rows)
            assert np.abs(np.array(got.probabilities) - run["reference"][:20]).max() < 1e-6
            pids.add(_pid_of(port))
        assert len(pids) == 2, pids
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.count("ready on http://127.0.0.1:") == 2, out


def _pid_of(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        resp.read()
        return str(resp.getheader("X-Daskhps-Pid"))
    finally:
        conn.close()


def test_cli_refuses_a_model_it_cannot_serve(
    tmp_path: Path,
    run: dict[str, Any],
    served: Running,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each refusal is one line and exit 1 (2 for a bad flag); the first through a process
    of its own (no traceback from the interpreter either), the others through the command
    line's main in this process (they stop before serving anything)."""
    before = tree_state(Path(run["cfg"].run.dir))
    model = ["--model", run["cfg"].run.dir]
    (tmp_path / "notes.txt").write_text("not a log\n")
    (tmp_path / "retrain" / "versions").mkdir(parents=True)
    (tmp_path / "retrain" / "versions" / "registry.json").write_text(
        '{"format": 1, "versions": [], "attempts": [], "events": []}'
    )
    cases = (
        (["--model", str(tmp_path / "nope")], "no such file or folder"),
        (["--model", str(tmp_path)], "nor a run directory"),
        ([*model, "--poll-s", "0"], "--poll-s must be > 0"),
        ([*model, "--port", "99999"], "--port must be in 0..65535"),
        ([*model, "--port", str(served.port)], f"127.0.0.1:{served.port} is in use"),
        ([*model, "--warmup", str(tmp_path / "none.tsv")], "--warmup"),
        ([*model, "--warmup", str(tmp_path / "notes.txt")], "no row of it reads"),
        (["--model", str(tmp_path / "retrain")], "holds no published version yet"),
    )
    for i, (args, words) in enumerate(cases):
        port = [] if "--port" in args else ["--port", str(_free_port())]
        if i == 0:
            proc = _serve_cli([*args, *port])
            _, err = proc.communicate(timeout=120)
            code = proc.returncode
        else:
            try:
                got = cli_here(capfd, caplog, "serve", *args, *port)
                code, err = got.returncode, got.stderr
            except SystemExit as e:  # a flag's value: the process exits 1 printing this
                code, err = 1, f"{e.code}\n"
        assert code != 0, (args, err)
        assert words in err, (args, err)
        assert len([line for line in err.splitlines() if "error" in line]) == 1, err
        assert "Traceback" not in err, err
    assert tree_state(Path(run["cfg"].run.dir)) == before  # nothing of the run was touched


def test_each_version_switch_is_one_line_saying_from_to_how_and_the_pause(
    run: dict[str, Any], registry: tuple[Registry, list[Any]]
) -> None:
    reg, ckpts = registry
    port = _free_port()
    proc = _serve_cli(
        ["--model", str(reg.folder.parent), "--port", str(port), "--poll-s", "0.2",
         "--device-rows", "500", "--host-mb", "1"]
    )  # fmt: skip
    try:
        with ServeClient(f"http://127.0.0.1:{port}") as c:
            c.wait_ready(120)
            publish_checkpoint(reg, "v000002", ckpts[1])
            deadline = time.monotonic() + 60
            while c.predict([{"I1": 1}]).version != "v000002":
                assert time.monotonic() < deadline, "the server never moved to v000002"
                time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    switches = [line for line in out.splitlines() if "now serving" in line]
    assert len(switches) == 1, out
    assert re.fullmatch(
        r"daskhps serve: now serving v000002 \(was v000001\): (replay|diff|full|new), "
        r"requests held [0-9.]+ ms \(pid \d+\)",
        switches[0],
    ), switches


def test_a_failed_switch_keeps_the_version_served_and_lets_go_of_the_new_ones_lease(
    run: dict[str, Any], registry: tuple[Registry, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A switch whose refresh fails (a segment the follower's compaction removed while it was
    read, as one did in a 200-chunk soak): the server says so and keeps the old version; the
    new version's lease is let go, so retention can remove it later (a lease kept so held a
    version past retrain.keep_versions for as long as the server ran)."""
    from daskhps.retrain.retention import removable

    reg, ckpts = registry
    r = Running(
        ServeOptions(model=str(reg.folder.parent), device_rows=500, host_bytes=0, poll_s=3600)
    )
    try:
        publish_checkpoint(reg, "v000002", ckpts[1])
        online = r.server.online
        assert online is not None
        real = online.scorer.refresh

        def gone(*args: Any, **kw: Any) -> Any:
            raise FileNotFoundError(2, "No such file or directory", "segments/0000000219")

        monkeypatch.setattr(online.scorer, "refresh", gone)
        with pytest.raises(FileNotFoundError):
            r.refresh()
        assert r.client.predict([{"I1": 1}]).version == "v000001"
        with removable(reg.folder, "v000002") as free:
            assert free  # no lease left on the version it failed to move to
        monkeypatch.setattr(online.scorer, "refresh", real)
        assert r.refresh().new == "v000002"  # the next poll moves
        with removable(reg.folder, "v000001") as free:
            assert free  # and lets go of the old one
    finally:
        r.close()

"""A follower whose logs are objects in a bucket (an S3 server on 127.0.0.1, tests/_s3.py),
reached through a relay that the test cuts for a while: the listing fails in one line each
time, the waits between listings double, the lag is exported, and once the bucket is back the
chunk that landed meanwhile is trained and published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from daskhps import storage
from daskhps.config import load_config
from daskhps.retrain import Registry
from daskhps.retrain.follow import follow
from daskhps.retrain.stopping import StopRequest
from tests._clusters import SharedClusters
from tests._logs import generated_logs
from tests._runs import tiny_config

pytestmark = pytest.mark.slow

POLL = 0.2


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    logs = generated_logs(
        tmp_path_factory, days=1, rows_per_day=600, parts_per_day=2, seed=4, name="objects"
    )
    return sorted((logs / "day=2024-01-01").glob("part-*"))


def test_a_bucket_out_of_reach_for_a_while(
    parts: list[Path], tmp_path: Path, shared_clusters: SharedClusters
) -> None:
    from tests._s3 import CutProxy, s3_server

    said: list[str] = []
    waits: list[float] = []
    with s3_server() as server:
        url = server.bucket("clicks") + "/incoming"
        proxy = CutProxy(server.endpoint)
        bucket = server.fs()
        bucket.put_file(str(parts[0]), f"clicks/incoming/{parts[0].name}")
        run = tmp_path / "run"
        cfg = tiny_config(
            run,
            tmp_path,  # replaced by the bucket's folder below
            cluster_section=shared_clusters.section(workers=1, threads=2),
            passes={"examples_per_pass": 300, "global_batch_size": 100},
            eval={"every_pass": False},
            retrain={"poll_seconds": POLL},
        )
        cfg["data"]["train"]["paths"] = [url]
        options = server.options
        options["s3"]["endpoint_url"] = proxy.endpoint
        # daskhps's own default where nothing sets retries: a pooled connection that the cut
        # closed fails once, then a new one is made
        options["s3"]["config_kwargs"]["retries"] = {"total_max_attempts": 2, "mode": "standard"}
        cfg["storage"] = {"options": options}
        (tmp_path / "follow.yaml").write_text(yaml.safe_dump(cfg))
        config = load_config(tmp_path / "follow.yaml")

        class Scenario(StopRequest):
            """What happens at each of the follower's waits between listings."""

            def wait(self, seconds: float) -> bool:
                waits.append(seconds)
                if len(waits) == 1:  # the first chunk is published: cut the link, and a
                    proxy.cut()  # second chunk lands meanwhile (written past the relay)
                    bucket.put_file(str(parts[1]), f"clicks/incoming/{parts[1].name}")
                elif len(waits) == 3:
                    status = json.loads((run / "follow.json").read_text())
                    assert status["listing_error"] and status["lag_seconds"] > 0
                    proxy.restore()
                elif len(waits) == 4:  # the second chunk is published: stop
                    self.set()
                return self.requested

        try:
            outcome = follow(config, say=said.append, stop=Scenario())
        finally:
            storage.use_options({"s3": {}})
            proxy.cut()
    assert outcome.code == 0, said
    failed = [s for s in said if "listing the logs failed" in s]
    assert len(failed) == 2 and "trying again in 0.2 s" in failed[0], said
    assert "trying again in 0.4 s" in failed[1]  # the wait doubles while it is out of reach
    assert waits == [POLL, POLL, 2 * POLL, POLL]  # and is the poll again once it is back
    versions = Registry(run / "versions").versions()
    assert [Path(v.chunk or "").name for v in versions] == [parts[0].name, parts[1].name]
    assert versions[1].baseline["examples"] == 300  # every row of the chunk
    assert json.loads((run / "follow.json").read_text())["listing_error"] is None

"""What a follower says of its lag while it runs: ``follow.json`` and the gauges on the
process's ``/metrics`` (the embedded cluster's dashboard serves that registry)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from prometheus_client import REGISTRY, generate_latest

from daskhps.retrain.follow_status import FollowStatus, exported


def _gauges() -> dict[str, float]:
    text = generate_latest(REGISTRY).decode()
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("daskhps_follow_")
    }


def test_the_lag_is_written_and_exported_while_following(tmp_path: Path) -> None:
    status = FollowStatus(waiting=3, trained=2, published="v000002")
    assert math.isnan(status.lag_seconds())  # nothing trained yet: no age
    status.newest_landed = 1000.0
    assert status.lag_seconds(now=1042.5) == 42.5
    status.progressive = {"auc": 0.71, "logloss": 0.5}
    status.write(tmp_path)
    written = json.loads((tmp_path / "follow.json").read_text())
    assert written["waiting"] == 3 and written["published"] == "v000002"
    assert written["lag_seconds"] > 42.5  # against the clock now
    with exported(status):
        g = _gauges()
        assert g["daskhps_follow_chunks_waiting"] == 3
        assert g["daskhps_follow_chunks_trained"] == 2
        assert g["daskhps_follow_progressive_auc"] == 0.71
        assert g["daskhps_follow_lag_seconds"] > 42.5
    assert _gauges() == {}  # a follower that ended exports nothing

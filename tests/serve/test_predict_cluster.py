"""``daskhps predict`` starts or connects its cluster as training does: a scheduler's TLS
files and ``storage.options`` reach it too."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from daskhps.serve import predict as predict_module
from daskhps.training.parts import RunParts
from tests.config.helpers import MINIMAL, load

TLS = """\
cluster:
  address: tls://scheduler.example:8786
  security: {ca_file: ca.pem, cert_file: client.pem, key_file: client.key}
storage:
  options:
    s3: {anon: true}
"""


class _Started(Exception):
    """Raised in place of starting the cluster, once its arguments are recorded."""


@pytest.mark.parametrize("on_scheduler", [True, False])
def test_predict_starts_its_cluster_with_the_runs_security_and_storage_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_scheduler: bool
) -> None:
    cfg = load(tmp_path, MINIMAL + TLS)
    data = tmp_path / "day.txt"
    data.write_text("")
    seen: dict[str, Any] = {}

    def start_cluster(**kwargs: Any) -> Any:
        seen.update(kwargs)
        raise _Started

    monkeypatch.setattr(predict_module, "start_cluster", start_cluster)
    servable = SimpleNamespace(config=cfg, tables=[], name="m")
    address = cfg.cluster.address if on_scheduler else None
    with pytest.raises(_Started):
        predict_module.predict(servable, str(data), tmp_path / "out", address=address)  # type: ignore[arg-type]
    train = RunParts(cfg, "run").cluster_args()
    assert seen["security"] == train["security"] == cfg.cluster.security
    assert seen["storage_options"] == train["storage_options"] == {"s3": {"anon": True}}
    assert seen["address"] == address
    assert (seen["gpus"], seen["dashboard_address"]) == (False, None)

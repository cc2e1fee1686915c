"""retrain.keep_versions end to end: real retraining runs on a warm LocalCluster, real stores.

Four days arrive one by one with ``keep_versions: 1``; a server's lease is held on v000001 while
v000002 is published, so v000001 stays; once released, the next publish removes v000001 and
v000002: their folders, their store commits and every segment only they used. CURRENT still
opens and checks clean, the listing leaves the removed versions out, and a rollback to one is
one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from daskhps.cli import main
from daskhps.retrain import ExitCode, Registry
from daskhps.retrain.retention import ServingLease
from daskhps.runfiles.checkpoint import load_checkpoint
from daskhps.tiers.store.check import StoreChecker
from daskhps.tiers.store.manifest import scan_manifests
from tests._clusters import SharedClusters
from tests.retrain.test_retrain_e2e import DAYS, _arrive, _config, all_days  # noqa: F401

pytestmark = pytest.mark.slow


def _commits_and_orphans(stores: Path) -> tuple[set[str], list[Path]]:
    """Commit names in every rank store, and segment folders no remaining commit uses."""
    names: set[str] = set()
    orphans: list[Path] = []
    for store in sorted(stores.glob("*/rank-*")):
        manifests, _ = scan_manifests(store / "commits")
        names |= {m.name for m in manifests}
        used = {sid for m in manifests for sid in m.segments}
        orphans += [
            p
            for p in (store / "segments").iterdir()
            if p.name.isdigit() and int(p.name) not in used
        ]
    return names, orphans


def test_old_versions_go_but_current_and_served_ones_stay(
    all_days: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shared_clusters: SharedClusters,
) -> None:
    logs = tmp_path / "logs"
    cfg = _config(tmp_path, logs, shared_clusters.section(workers=1, threads=2))
    d = yaml.safe_load(cfg.read_text())
    d["retrain"]["keep_versions"] = 1
    cfg.write_text(yaml.safe_dump(d))
    registry = Registry(tmp_path / "run" / "versions")

    _arrive(all_days, logs, DAYS[0])
    _arrive(all_days, logs, DAYS[1])
    assert main(["retrain", str(cfg)]) == ExitCode.PUBLISHED
    v1 = registry.current()
    assert v1 is not None

    lease = ServingLease(registry.folder, v1.name)  # a server still serves v000001
    _arrive(all_days, logs, DAYS[2])
    assert main(["retrain", str(cfg)]) == ExitCode.PUBLISHED
    assert not registry.removed(v1.name) and Path(v1.checkpoint).is_dir()
    lease.release()

    _arrive(all_days, logs, DAYS[3])
    assert main(["retrain", str(cfg)]) == ExitCode.PUBLISHED
    out = capsys.readouterr().out
    assert "Removed v000001, v000002 (retrain.keep_versions: 1)" in out
    v3 = registry.current()
    assert v3 is not None and v3.name == "v000003"
    for name in ("v000001", "v000002"):
        assert registry.removed(name)
        assert not (registry.folder / name).exists()

    stores = Path(v3.stores_dir)
    names, orphans = _commits_and_orphans(stores)
    assert "version-v000003" in names
    assert not {"version-v000001", "version-v000002"} & names
    assert orphans == []  # every segment on disk is one a remaining commit reads
    ckpt = load_checkpoint(v3.checkpoint)
    for rank in range(ckpt.num_workers):
        assert StoreChecker(verify=True).check(ckpt.store_path(rank), ckpt.commit).ok

    assert main(["retrain", str(cfg), "--versions"]) == 0
    listing = capsys.readouterr().out
    assert "v000003" in listing
    assert "removed by retrain.keep_versions: v000001, v000002" in listing
    assert not [line for line in listing.splitlines() if line.lstrip("* ").startswith("v000001")]
    assert main(["retrain", str(cfg), "--rollback", "v000001"]) == ExitCode.BAD_CONFIG
    err = capsys.readouterr().err
    assert "removed by retrain.keep_versions" in err
    assert registry.current() == v3

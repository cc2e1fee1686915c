"""The copy of a run's stores at ``checkpoint.replicate_to`` (daskhps/runfiles/replica.py), on
real zarr stores: a plain folder, a ``file://`` URL and fsspec's in-memory filesystem (a URL
that is not a local folder). Mirroring moves only the files the copy lacks, pruning removes
what the store dropped, and the copy reopens at every kept commit with the store's rows."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch

from daskhps.errors import ConfigError
from daskhps.runfiles.replica import Replica, mirror_store, prune_store
from daskhps.tiers.store import StoreReader, open_store
from daskhps.tiers.store.check import StoreChecker

W = 4
LAYOUT = {"table": "emb", "dim": 2, "width": W, "optimizer": "adagrad", "dtype": "float32"}


def _store(path: Path, mode: str = "a", commit: str | None = None) -> StoreReader:
    return open_store(
        path,
        name="emb/zarr",
        width=W,
        layout=LAYOUT,
        mode=mode,
        commit=commit,  # type: ignore[arg-type]
    )


def _files(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and p.name != "LOCK" and not p.name.endswith(".tmp")
    }


@pytest.fixture(params=["path", "file", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "path":
        return str(tmp_path / "copy")
    if request.param == "file":
        return f"file://{tmp_path / 'copy'}"
    return f"memory://daskhps-test-{uuid.uuid4().hex}"


def _rows(store: StoreReader, keys: torch.Tensor) -> torch.Tensor:
    return store.lookup(keys).rows


def test_the_copy_moves_only_new_files_drops_what_the_store_dropped_and_reopens(
    tmp_path: Path, url: str
) -> None:
    local = tmp_path / "stores" / "emb" / "rank-0"
    replica = Replica(url)
    dest = replica.store_path("stores", "emb", 0)
    gen = torch.Generator().manual_seed(0)
    keys = torch.randperm(1 << 20, generator=gen)[:3000].to(torch.int64)
    with _store(local) as s:
        s.upsert(keys[:2000], torch.randn(2000, W, generator=gen))
        s.commit("pass-000001")
    first = mirror_store(replica.fs, local, dest)
    assert first.files == len(_files(local)) and first.bytes > 0
    assert mirror_store(replica.fs, local, dest).files == 0  # nothing new: nothing moves

    with _store(local) as s:
        s.upsert(keys[1500:], torch.randn(1500, W, generator=gen))  # 500 rewritten, 1000 new
        s.commit("pass-000002")
        expected = _rows(s, keys)
    delta = mirror_store(replica.fs, local, dest)
    assert 0 < delta.files < len(_files(local))  # a delta's files, not the store's
    with _store(local) as s:
        s.drop_commits(1)  # what keep does: pass-000001 and the files only it used go
    removed = prune_store(replica.fs, local, dest)
    assert removed > 0
    copied = {p[len(dest) + 1 :] for p in replica.fs.find(dest)}
    assert copied == _files(local)

    back = tmp_path / "back"
    replica.fs.get(dest + "/", str(back), recursive=True)
    assert StoreChecker(verify=True).check(back, "pass-000002").ok
    with _store(back, mode="r", commit="pass-000002") as s:
        assert torch.equal(s.keys().sort().values, keys.sort().values)
        assert torch.equal(_rows(s, keys), expected)


@pytest.mark.parametrize("where", ["below a file", "not creatable"])
def test_a_location_that_cannot_be_written_is_one_line_and_leaves_nothing(
    tmp_path: Path, where: str
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    url = str(blocker / "copy") if where == "below a file" else "/proc/daskhps-copy"
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ConfigError) as e:
        Replica(url).check_writable("run.yaml")
    text = str(e.value)
    assert "\n" not in text, text
    assert text.startswith(f"run.yaml: checkpoint.replicate_to: cannot write checkpoints to {url}")
    assert "set it to a writable folder or URL" in text
    assert sorted(tmp_path.rglob("*")) == before and blocker.read_text() == "not a folder"


def test_a_writable_location_keeps_no_probe(tmp_path: Path) -> None:
    Replica(f"file://{tmp_path / 'copy'}").check_writable("run.yaml")
    assert not (tmp_path / "copy").exists()  # made for the probe, then removed
    (tmp_path / "there").mkdir()
    Replica(str(tmp_path / "there")).check_writable("run.yaml")
    assert list((tmp_path / "there").iterdir()) == []


def test_workers_sharing_a_new_copy_folder_check_it_at_once(tmp_path: Path) -> None:
    """Every worker checks the copy before a run (they share it): checks at once neither
    refuse nor leave a folder behind."""
    import threading

    failures: list[str] = []

    def check() -> None:
        for _ in range(100):
            try:
                Replica(str(tmp_path / "copy" / "attempts" / "a1")).check_writable("run.yaml")
            except ConfigError as e:
                failures.append(str(e))

    threads = [threading.Thread(target=check) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [] and list(tmp_path.iterdir()) == []

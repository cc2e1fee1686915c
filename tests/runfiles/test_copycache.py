"""The local cache of copies in object storage (daskhps/runfiles/copycache.py) against a model:
copies in fsspec's in-memory filesystem, fetched in a random order into a cache with a random
limit. After every fetch the checkpoint read is whole in the cache, the cache holds at most
its limit, and what was evicted is what least recent use says; a checkpoint larger than the
limit is refused before anything is fetched. A fetch is logged at INFO, with a bar on a
terminal."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import time
from pathlib import Path

import fsspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskhps.errors import StorageError
from daskhps.runfiles.checkpoint import MANIFEST
from daskhps.runfiles.copycache import CopyCache


def _copy(fs: fsspec.AbstractFileSystem, root: str, sizes: list[int]) -> int:
    """A copy at ``root`` with one checkpoint whose store files have ``sizes``; its bytes."""
    manifest = json.dumps({"stores_dir": "../../stores/stores"}).encode()
    fs.pipe_file(f"{root}/checkpoints/pass-000001/dense.pt", b"d" * 10)
    for i, n in enumerate(sizes):
        fs.pipe_file(f"{root}/stores/stores/embeddings/rank-0/segments/{i}", b"r" * n)
    fs.pipe_file(f"{root}/checkpoints/pass-000001/{MANIFEST}", manifest)
    return 10 + sum(sizes) + len(manifest)


def _held(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


@settings(max_examples=25, deadline=None)
@given(
    copies=st.lists(st.lists(st.integers(0, 3000), min_size=1, max_size=4), min_size=1, max_size=4),
    reads=st.lists(st.integers(0, 3), min_size=1, max_size=10),
    limit=st.integers(500, 9000),
)
def test_the_cache_against_its_model(
    copies: list[list[int]], reads: list[int], limit: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fs = fsspec.filesystem("memory")
    tag = os.urandom(4).hex()
    urls, need = [], []
    for i, sizes in enumerate(copies):
        urls.append(f"memory://cache-{tag}/copy-{i}")
        need.append(_copy(fs, f"/cache-{tag}/copy-{i}", sizes))
    cache = CopyCache(tmp_path_factory.mktemp("cache"), limit)
    used: list[int] = []  # the model: copies in the cache, least recently used first
    for r in reads:
        i = r % len(urls)
        if need[i] > limit:
            before = _held(cache.root)
            with pytest.raises(StorageError, match="more than its limit"):
                cache.checkpoint(urls[i], "pass-000001")
            assert _held(cache.root) == before  # nothing fetched
            continue
        time.sleep(0.002)  # distinct use times
        got = cache.checkpoint(urls[i], "pass-000001")
        assert (got.path / MANIFEST).is_file() and (got.path / "dense.pt").stat().st_size == 10
        assert _held(cache.folder(urls[i])) >= need[i]  # whole
        assert got.cached_bytes == _held(cache.root / "copies") <= limit
        used = [u for u in used if u != i] + [i]
        # The model's eviction: least recently used first, until within the limit.
        while sum(need[u] for u in used) > limit:
            used.pop(0)
        present = {j for j in range(len(urls)) if cache.folder(urls[j]).exists()}
        assert present == set(used)
    fs.rm(f"/cache-{tag}", recursive=True)


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_a_fetch_is_information_and_shows_a_bar_on_a_terminal_only(
    terminal: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The fetch's line is INFO (progress, not a problem: the command line shows warnings by
    default); what shows a long fetch instead is a bar, on a terminal, none in a log file, and
    none for a read that fetches the manifest alone."""
    fs = fsspec.filesystem("memory")
    root = f"/cache-{os.urandom(4).hex()}/copy"
    _copy(fs, root, [2000, 3000])
    cache = CopyCache(tmp_path, 1 << 20)
    caplog.set_level(logging.INFO, logger="daskhps.runfiles.copycache")
    for n in (3 + 1, 1):  # whole, then the manifest alone: the rest is in the cache
        stderr = _Terminal() if terminal else io.StringIO()
        monkeypatch.setattr(sys, "stderr", stderr)
        caplog.clear()
        assert cache.checkpoint(f"memory://{root}", "pass-000001").files == n
        (record,) = [r for r in caplog.records if "through the local cache" in r.message]
        assert record.levelno == logging.INFO
        bar = "fetching pass-000001" in stderr.getvalue()
        assert bar == (terminal and n > 1), stderr.getvalue()
    fs.rm(root.rsplit("/", 1)[0], recursive=True)


@pytest.mark.parametrize(
    ("named", "taken"),
    [("pass-000001", "pass-000001"), (None, "pass-000003"), ("pass-000002", "pass-000003")],
)
def test_a_copys_root_serves_the_model_its_newest_checkpoint_names(
    named: str | None, taken: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the run's model (eval.best_by) of a copy: the one its newest manifest names when the
    # copy holds it (pass-000002 was pruned from this one), else its newest
    from daskhps.runfiles.copycache import CACHE_DIR_ENV, fetched_model

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    fs = fsspec.filesystem("memory")
    root = f"/model-{os.urandom(4).hex()}"
    for name in ("pass-000001", "pass-000003"):
        manifest: dict = {"stores_dir": "../../stores/stores"}
        if name == "pass-000003" and named is not None:
            manifest["model"] = {"checkpoint": named, "metric": "auc", "value": 0.7}
        fs.pipe_file(f"{root}/checkpoints/{name}/dense.pt", b"d")
        fs.pipe_file(f"{root}/checkpoints/{name}/{MANIFEST}", json.dumps(manifest).encode())
    fs.pipe_file(f"{root}/stores/stores/embeddings/rank-0/segments/0", b"r")
    path, checkpoint = fetched_model(f"memory:/{root}")
    assert Path(path).name == taken and checkpoint is None
    # a name given still picks that one
    assert Path(fetched_model(f"memory:/{root}", "1")[0]).name == "pass-000001"
    fs.rm(root, recursive=True)

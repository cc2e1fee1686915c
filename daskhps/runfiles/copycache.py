"""A checkpoint's copy in object storage, read through a size-bounded cache on local disk.

``daskhps inspect``, ``predict``, ``export`` and ``serve`` read a model in object storage
(``--model s3://bucket/copy``, or a run whose ``checkpoint.replicate_to`` is a URL and whose
stores are not on this machine) from a local mirror of the files that checkpoint reads::

    <cache>/copies/<bucket>-<hash of the copy's URL>/
        checkpoints/<name>/        its files, MANIFEST.json last (a fetch cut short is never
                                   loaded: it is fetched again)
        stores/<stores>/...        the store it reads; store files never change once written,
                                   so a file already here at its size is not fetched again
                                   (following a retraining run's publishes fetches its deltas)
        .used                      touched at each use

The cache lives in ``$DASKHPS_CACHE_DIR`` (default ``$XDG_CACHE_HOME/daskhps``, else
``~/.cache/daskhps``) and holds at most ``$DASKHPS_CACHE_SIZE`` (default 20 GiB; a byte count
or a size such as ``50GiB``): after a fetch, the least recently used copies go first, then the
checkpoints and stores of this copy that the checkpoint being read does not use. A checkpoint
larger than the limit is refused in one line before anything is fetched. Every fetch is
logged at INFO (``-v``) with what it moved and what the cache holds; on a terminal, a fetch of
more than the checkpoint's manifest shows a progress bar of its bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from daskhps import storage
from daskhps.errors import CheckpointError, StorageError
from daskhps.options import parse_size
from daskhps.runfiles.checkpoint import MANIFEST, checkpoint_name

__all__ = ["CACHE_DIR_ENV", "CACHE_SIZE_ENV", "CopyCache", "Fetched", "fetched_model"]

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "DASKHPS_CACHE_DIR"
CACHE_SIZE_ENV = "DASKHPS_CACHE_SIZE"
DEFAULT_LIMIT = 20 << 30
_USED = ".used"


def _default_root() -> Path:
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "daskhps"


def _default_limit() -> int:
    raw = os.environ.get(CACHE_SIZE_ENV)
    if not raw:
        return DEFAULT_LIMIT
    value = parse_size(raw.strip(), "bytes or a size")
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise StorageError(
            f"{CACHE_SIZE_ENV}={raw!r} is not a size: give bytes or a size such as 20GiB"
        )
    return value


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _tree_bytes(folder: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(folder):
        for n in names:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += (Path(dirpath) / n).stat().st_size
    return total


def _cached(local: Path, size: int) -> bool:
    """Whether the cache holds the file whole (files never change once written)."""
    return local.is_file() and local.stat().st_size == size


def _fetch(fs: Any, path: str, local: Path) -> None:
    """Fetch ``path`` of ``fs`` to ``local``: whole, or not at all."""
    local.parent.mkdir(parents=True, exist_ok=True)
    part = local.with_name(f".{local.name}.{os.getpid()}.part")
    try:
        fs.get_file(path, str(part))
    except Exception as e:
        part.unlink(missing_ok=True)
        raise storage.failure(fs.unstrip_protocol(path), e) from None
    os.replace(part, local)


@dataclass(frozen=True)
class Fetched:
    """One checkpoint made local: where it is, what the fetch moved, what the cache holds."""

    path: Path
    files: int
    bytes: int
    cached_bytes: int
    limit: int


class CopyCache:
    """The cache at ``root`` (default: see the module docstring) holding at most ``limit``
    bytes."""

    def __init__(self, root: str | Path | None = None, limit: int | None = None) -> None:
        self.root = Path(root) if root is not None else _default_root()
        self.limit = limit if limit is not None else _default_limit()

    def folder(self, url: str) -> Path:
        """Where the copy at ``url`` is mirrored."""
        base = url.rstrip("/")
        label = (storage.bucket_of(base) or storage.protocol_of(base) or "copy").replace("/", "-")
        digest = hashlib.sha256(base.encode()).hexdigest()[:12]
        return self.root / "copies" / f"{label}-{digest}"

    def checkpoint(self, url: str, name: str) -> Fetched:
        """Checkpoint ``name`` of the copy at ``url`` (its root: the folder holding
        ``checkpoints/``), fetched as far as it is not here already."""
        fs, root = storage.filesystem(url)
        root = root.rstrip("/")
        remote = f"{root}/checkpoints/{name}"
        try:
            manifest = json.loads(fs.cat_file(f"{remote}/{MANIFEST}"))
        except FileNotFoundError:
            raise CheckpointError(
                f"{storage.shown(url)} has no complete checkpoint {name} (no "
                f"checkpoints/{name}/{MANIFEST}); give the copy's root or one of its checkpoints"
            ) from None
        except Exception as e:
            raise storage.failure(f"{url.rstrip('/')}/checkpoints/{name}", e) from None
        stores_rel = str(manifest.get("stores_dir", ""))
        stores_remote = posixpath.normpath(posixpath.join(remote, stores_rel))
        if not stores_remote.startswith(f"{root}/stores/"):
            raise CheckpointError(
                f"{storage.shown(url)}/checkpoints/{name}: its stores_dir {stores_rel!r} is "
                "not in the copy's stores/ folder: it is no checkpoint of a copy"
            )
        try:
            files = {
                **{p: int(i["size"]) for p, i in fs.find(remote, detail=True).items()},
                **{p: int(i["size"]) for p, i in fs.find(stores_remote, detail=True).items()},
            }
        except Exception as e:
            raise storage.failure(url, e, "list") from None
        need = sum(files.values())
        if need > self.limit:
            raise StorageError(
                f"{storage.shown(url)}/checkpoints/{name} needs {_size(need)} of local cache, "
                f"more than its limit of {_size(self.limit)}: raise "
                f"{CACHE_SIZE_ENV}, or fetch the copy to a folder and give that"
            )
        here = self.folder(url)
        here.mkdir(parents=True, exist_ok=True)
        (here / _USED).touch()
        manifest_key = f"{remote}/{MANIFEST}"
        todo = [
            p
            for p in files
            if p == manifest_key or not _cached(here / posixpath.relpath(p, root), files[p])
        ]
        # The manifest last: a checkpoint whose fetch was cut short has none and is not loaded.
        todo.sort(key=lambda p: p == manifest_key)
        moved, moved_bytes = len(todo), sum(files[p] for p in todo)
        with tqdm(
            total=moved_bytes,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=f"fetching {name}",
            # A bar on a terminal only (none in a log file), and only when it fetches more
            # than the manifest, which every read fetches again (a few KiB).
            disable=None if moved > 1 else True,
        ) as bar:
            for path in todo:
                _fetch(fs, path, here / posixpath.relpath(path, root))
                bar.update(files[path])
        local_ckpt = here / "checkpoints" / name
        held = self._trim(here, local_ckpt, here / posixpath.relpath(stores_remote, root))
        # Information, not a problem: the bar shows a long fetch on a terminal; -v shows this.
        log.info(
            "read %s/checkpoints/%s through the local cache %s: fetched %d file(s), %s; "
            "the cache holds %s of %s",
            storage.shown(url.rstrip("/")),
            name,
            here,
            moved,
            _size(moved_bytes),
            _size(held),
            _size(self.limit),
        )
        return Fetched(local_ckpt, moved, moved_bytes, held, self.limit)

    def _trim(self, here: Path, ckpt: Path, stores: Path) -> int:
        """Keep the cache within its limit: other copies least recently used first, then what
        of this copy the checkpoint being read does not use. The bytes it holds after."""
        copies = self.root / "copies"
        total = _tree_bytes(copies)
        others = sorted(
            (f for f in copies.iterdir() if f.is_dir() and f != here),
            key=lambda f: (f / _USED).stat().st_mtime if (f / _USED).exists() else 0.0,
        )
        for folder in others:
            if total <= self.limit:
                return total
            total -= _tree_bytes(folder)
            shutil.rmtree(folder, ignore_errors=True)
        for kind, keep in (("checkpoints", ckpt), ("stores", stores)):
            for folder in sorted((here / kind).glob("*")) if (here / kind).is_dir() else []:
                if total <= self.limit:
                    return total
                if folder != keep:
                    total -= _tree_bytes(folder)
                    shutil.rmtree(folder, ignore_errors=True)
        return total


def _model_of(url: str) -> str:
    """The name of the run's model in the copy at ``url``: the checkpoint its newest complete
    one names as the best (``eval.best_by``) when the copy holds it, else the newest."""
    fs, root = storage.filesystem(url)
    names = _complete(url)
    try:
        manifest = json.loads(fs.cat_file(f"{root.rstrip('/')}/checkpoints/{names[-1]}/{MANIFEST}"))
    except Exception as e:
        raise storage.failure(url, e, "read") from None
    named = (manifest.get("model") or {}).get("checkpoint")
    return named if named in names else names[-1]


def _complete(url: str) -> list[str]:
    """The names of the complete checkpoints of the copy at ``url``, oldest first."""
    fs, root = storage.filesystem(url)
    folder = f"{root.rstrip('/')}/checkpoints"
    try:
        names = sorted(
            p.rstrip("/").rsplit("/", 1)[-1]
            for p in fs.ls(folder, detail=False)
            if fs.exists(f"{p.rstrip('/')}/{MANIFEST}")
        )
    except FileNotFoundError:
        names = []
    except Exception as e:
        raise storage.failure(url, e, "list") from None
    if not names:
        storage.check_bucket(url)
        raise CheckpointError(
            f"{storage.shown(url)} holds no complete checkpoint (no checkpoints/*/{MANIFEST}): "
            "give the URL of a checkpoint copy (checkpoint.replicate_to of a run)"
        )
    return names


def fetched_model(model: str, checkpoint: str | None = None) -> tuple[str, str | None]:
    """``--model`` and ``--checkpoint`` as the local readers take them: a path stays as it
    is; a URL (the root of a run's copy, or one of its ``checkpoints/<name>``) becomes the
    cached checkpoint folder (the newest complete one, or ``checkpoint``)."""
    if not storage.is_url(model):
        return storage.local_path(model), checkpoint
    url = model.rstrip("/")
    head, _, last = url.rpartition("/")
    if head.endswith("/checkpoints"):
        if checkpoint is not None:
            raise CheckpointError(
                f"--checkpoint {checkpoint} picks one of a copy's checkpoints, but "
                f"{storage.shown(url)} is one already: give the copy's root, or leave "
                "--checkpoint out"
            )
        root, name = head[: -len("/checkpoints")], last
    else:
        root, name = url, checkpoint or _model_of(url)
        if name.isdigit():
            name = checkpoint_name(int(name))
    return str(CopyCache().checkpoint(root, name).path), None

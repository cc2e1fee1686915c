"""The model an online server scores with, and how it moves to a newly published version.

::

    --model RUN          a retraining run: follows its registry's CURRENT (publishes, rollbacks)
    --model CHECKPOINT   a checkpoint folder, a version's folder or a training run directory:
                         served as it is at start

    poll thread    every poll_s: read CURRENT ──changed──► prepare (beside the served view):
                     load the checkpoint, build its dense model with the new weights; the
                     same table(s): open the new commit's stores and diff segment sets, table
                     by table (lookup.prepare); another table or model (dim, schema, model
                     class, the tables or how fields are keyed): open a whole new lookup
    IO loop thread requests, one at a time ──► swap, between two requests:
                     the same table: swap the stores, replace the cached rows of changed
                     keys (lookup.refresh(prepared)), then the dense model; another table:
                     the new view replaces the old one, which is closed

Every request is read and scored on the server's IO loop thread by one view from start to end
(the reader of its schema, its lookup, its dense model), and its answer
names that view's version: no request mixes two versions, and none fails for a refresh. What
it costs: a refresh of the same table holds requests for the swap alone (the re-read of the
changed cached rows), and holds a second key index and dense model while it is prepared; a
refresh to another table holds a second set of caches while it is prepared.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import torch

from daskhps.data.schema import Schema
from daskhps.errors import DaskHPSError
from daskhps.retrain.retention import ServingLease
from daskhps.retrain.versions import Registry
from daskhps.runfiles.published import registry_folder
from daskhps.serve.inputs import Inputs
from daskhps.serve.lookup import PreparedRefresh
from daskhps.serve.requests import RowReader
from daskhps.serve.score import CacheSizes, Scorer
from daskhps.serve.stores import check_stores
from daskhps.serve.tables import PreparedTables
from daskhps.serve.version import Servable, load_servable

__all__ = ["ModelSource", "OnlineModel", "Prepared", "Published", "Swap"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Published:
    """What ``--model`` names now: the version's name and where its checkpoint is."""

    version: str
    checkpoint: Path | None  # None: the path itself (a checkpoint or a training run)


class ModelSource:
    """Where the served model comes from: a retraining run's registry (followed), or a fixed
    checkpoint (a checkpoint folder, a version's folder, a training run directory)."""

    def __init__(self, path: str | Path) -> None:
        from daskhps.runfiles.copycache import fetched_model

        # A copy in object storage is a fixed checkpoint, fetched into the local cache.
        self.path = Path(fetched_model(str(path))[0])
        folder = registry_folder(self.path)
        self.registry = Registry(folder) if folder is not None else None

    @property
    def follows(self) -> bool:
        return self.registry is not None

    def current(self) -> Published:
        """The version to serve now (reads ``CURRENT``: a few bytes)."""
        if self.registry is None:
            return Published("", None)
        version = self.registry.current()
        if version is None:
            raise DaskHPSError(
                f"{self.registry.folder} holds no published version yet (no CURRENT); run "
                "`daskhps retrain CONFIG` until one is published, or serve a checkpoint"
            )
        return Published(version.name, Path(version.checkpoint))

    def lease(self, published: Published) -> ServingLease | None:
        """Hold ``published`` against retention (``retrain.keep_versions``) while it is loaded
        and served; None for a fixed checkpoint."""
        if self.registry is None:
            return None
        return ServingLease(self.registry.folder, published.version)

    def load(self, published: Published) -> Servable:
        servable = load_servable(published.checkpoint or self.path)
        for table in servable.tables:
            check_stores(table, str(self.path))
        return servable


@dataclass
class Prepared:
    """A version made ready beside the served one; :meth:`OnlineModel.swap` serves it."""

    published: Published
    servable: Servable
    model: torch.nn.Module
    refresh: PreparedRefresh | PreparedTables | None  # the same tables: their stores opened
    # beside the served ones, and each table's delta
    scorer: Scorer | None  # a whole new view: the table or the model is another
    reader: RowReader | None  # with a new view: the reader of its schema
    seconds: float
    lease: ServingLease | None = None  # held from before it was loaded


@dataclass(frozen=True)
class Swap:
    """One move to another version: how, and how long requests were held for it."""

    old: str
    new: str
    how: Literal["replay", "diff", "full", "new"]
    changed_keys: int
    prepare_seconds: float
    pause_seconds: float


def _label(published: Published, servable: Servable) -> str:
    return published.version or servable.name


class OnlineModel:
    """The served view: a :class:`Scorer`, the :class:`RowReader` of its schema (:attr:`reader`)
    and the name of its version. Reading, :meth:`score_inputs`, :meth:`score` and :meth:`swap`
    run on one thread (the server's IO loop); :meth:`prepare` on any."""

    def __init__(
        self,
        source: ModelSource,
        sizes: CacheSizes,
        batch_size: int = 4096,
        max_rows: int = 65536,
    ) -> None:
        self.source = source
        self.sizes = sizes
        self.batch_size = batch_size
        self.max_rows = max_rows
        self.published = source.current()
        self._lease = source.lease(self.published)  # before loading: retention waits for it
        try:
            servable = source.load(self.published)
            self.scorer = Scorer(servable, sizes, batch_size)
        except BaseException:
            if self._lease is not None:
                self._lease.release()
            raise
        self.version = _label(self.published, servable)
        self.reader = RowReader(self.scorer.schema, max_rows)

    @property
    def schema(self) -> Schema:
        return self.scorer.schema

    def score_inputs(self, inputs: Inputs) -> tuple[str, np.ndarray]:
        """The version and the click probabilities of rows :attr:`reader` read, in order."""
        return self.version, self.scorer.score_inputs(inputs)

    def score(self, frame: pd.DataFrame) -> tuple[str, np.ndarray]:
        """The version and the click probabilities of parsed rows, in frame order."""
        return self.version, self.scorer.score(frame)

    def changed(self) -> Published | None:
        """The newly current version, when ``CURRENT`` names another than the served one."""
        if not self.source.follows:
            return None
        now = self.source.current()
        return None if now == self.published else now

    def prepare(self, published: Published) -> Prepared:
        """Load ``published`` beside the served view (nothing served changes)."""
        t = time.perf_counter()
        lease = self.source.lease(published)
        try:
            return self._prepare(published, lease, t)
        except BaseException:
            if lease is not None:
                lease.release()
            raise

    def _prepare(self, published: Published, lease: ServingLease | None, t: float) -> Prepared:
        servable = self.source.load(published)
        old = self.scorer.servable
        same = (
            [t.spec for t in servable.tables] == [t.spec for t in old.tables]
            and servable.config.model == old.config.model
            and servable.config.data.schema == old.config.data.schema
            and servable.config.field_keys() == old.config.field_keys()
        )
        refresh: PreparedRefresh | PreparedTables | None = None
        scorer: Scorer | None = None
        reader: RowReader | None = None
        if same:
            model = servable.build_model()
            refresh = self.scorer.prepare(servable)
        else:
            scorer = Scorer(servable, self.sizes, self.batch_size)
            reader = RowReader(scorer.schema, self.max_rows)
            model = scorer.model
        seconds = time.perf_counter() - t
        return Prepared(published, servable, model, refresh, scorer, reader, seconds, lease)

    def swap(self, prepared: Prepared) -> Swap:
        """Serve ``prepared`` from the next request on (call between two requests). When it
        fails, the version served stays, and ``prepared``'s lease is let go: a lease kept by
        a failed swap would keep its version from retention for as long as the server runs."""
        try:
            return self._swap(prepared)
        except BaseException:
            if prepared.lease is not None:
                prepared.lease.release()
            raise

    def _swap(self, prepared: Prepared) -> Swap:
        t = time.perf_counter()
        old_version = self.version
        if prepared.scorer is not None:
            assert prepared.reader is not None
            old, self.scorer, self.reader = self.scorer, prepared.scorer, prepared.reader
            old.close()
            how: Literal["replay", "diff", "full", "new"] = "new"
            changed = -1
        else:
            assert prepared.refresh is not None
            report = self.scorer.refresh(prepared.refresh)
            self.scorer.model = prepared.model
            self.scorer.servable = prepared.servable
            how, changed = report.how, report.changed_keys
        self.published = prepared.published
        self.version = _label(prepared.published, prepared.servable)
        if self._lease is not None:  # the old version may go now
            self._lease.release()
        self._lease = prepared.lease
        pause = time.perf_counter() - t
        log.debug(
            "now serving %s (was %s): %s, %s changed keys, prepared in %.2f s, requests held "
            "%.1f ms",
            self.version,
            old_version,
            how,
            changed if changed >= 0 else "all",
            prepared.seconds,
            pause * 1e3,
        )
        return Swap(old_version, self.version, how, changed, prepared.seconds, pause)

    def close(self) -> None:
        self.scorer.close()
        if self._lease is not None:
            self._lease.release()

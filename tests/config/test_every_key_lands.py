"""Every documented config key reaches the component it configures.

``LANDINGS`` is the reviewed table of where each key of the reference (daskhps.config.reference,
docs/configuration.md) lands: the overrides that give it a non-default value and a probe that
observes it in the component the run builds from the config — the objects the trainer makes
(its WorkerShards opened on a stand-in worker, the dense-replica setup it hands to the workers,
the pass plan and schedule, the cluster and collective arguments), the click-log reader, the
log generator, the checkpointer, the capacity check and the publish guard. Each case observes
the base config and the variant: the variant must change what the component does (and match
``expect`` where one is given). A key of the reference without a row here fails
``test_every_reference_key_has_a_landing``, so a new key cannot be silently ignored.

No cluster: what only workers consume is checked on the object handed to them.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dask.threaded
import numpy as np
import pytest
import torch

from daskhps._yaml import dump_yaml, parse_scalar
from daskhps.capacity import check_fits
from daskhps.config import RunConfig
from daskhps.config._keys import LISTS, all_keys
from daskhps.config.cluster import ClusterSecurity
from daskhps.config.reference import defaults
from daskhps.data.backend import cudf_available
from daskhps.data.holdout import read_train_and_holdout
from daskhps.data.schema import criteo_schema
from daskhps.data.source import day_of
from daskhps.data.synthetic import GeneratorConfig, generate
from daskhps.distributed import RunHost
from daskhps.errors import ConfigError, DataError
from daskhps.passes import build_plan, plan_owner_keys
from daskhps.passes.scan import scan_log
from daskhps.retrain.guard import judge
from daskhps.runfiles import checkpoint as ck
from daskhps.runfiles import writing
from daskhps.sharding import ShardMap
from daskhps.table.optimizers import apply_update
from daskhps.table.read_path import initial_rows as table_initial_rows
from daskhps.training.checkpointer import Checkpointer, Position
from daskhps.training.resume import stores_to_train_in
from daskhps.training.trainer import Trainer
from daskhps.training.watch import ModelWatch

ADDRESSES = ["tcp://w:0", "tcp://w:1"]
GiB = 1 << 30
CHANGED = object()  # expect: anything but what the base config gives

# Keys whose value is a mapping of other keys: they land where their keys land.
SECTIONS = {
    "data.train": "data.train.paths",
    "data.generate": "data.generate.days",
    "data.bad_rows": "data.bad_rows.action",
    "data.holdout": "data.holdout.day",
    "table.optimizer": "table.optimizer.kind",
    "table.admission": "table.admission.min_count",
    "table.expiry": "table.expiry.ttl_days",
    "table.tiers": "table.tiers.policy",
    "table.tiers.device": "table.tiers.device.rows",
    "table.tiers.host": "table.tiers.host.fraction",
    "tables.optimizer": "tables.optimizer.kind",
    "tables.admission": "tables.admission.min_count",
    "tables.expiry": "tables.expiry.ttl_days",
    "tables.tiers": "tables.tiers.policy",
    "tables.tiers.device": "tables.tiers.device.rows",
    "tables.tiers.host": "tables.tiers.host.fraction",
}


# -- what a config builds ----------------------------------------------------------------


class Built:
    """The components a run builds from ``cfg``, each made on first use (as the run makes it)."""

    def __init__(self, cfg: RunConfig, tmp: Path) -> None:
        self.cfg = cfg
        self.tmp = tmp
        self.trainer = Trainer(cfg, progress=False)
        self._close: list[Callable[[], None]] = []

    def close(self) -> None:
        for fn in reversed(self._close):
            fn()

    @cached_property
    def logs(self) -> Any:
        data = self.cfg.data  # Trainer.run reads exactly this (before the cluster starts)
        return read_train_and_holdout(data.source, data.holdout, data.backend, data.block_size)

    @cached_property
    def plan(self) -> Any:
        """The pass plan as PassLoop._begin makes it: the planning scan's row counts, then
        build_plan with the arguments the run passes (no holdout spill: no worker disks)."""
        train = self.logs[0]
        scan = scan_log(train, None, None)
        cfg = self.cfg
        return build_plan(
            train,
            cfg.passes.plan,
            len(ADDRESSES),
            seed=cfg.run.seed,
            partition_lengths=scan.lengths,
        )

    @cached_property
    def setup(self) -> Any:
        return self.trainer.parts.train_setup()  # handed to every rank's dense replica

    @cached_property
    def model(self) -> torch.nn.Module:
        s = self.setup  # built on each rank exactly so (daskhps.training.worker._Replica)
        return s.model.build_for(s.layout)

    @cached_property
    def host(self) -> Any:
        """The trainer's WorkerShards in a run host, set up and opened on a stand-in for rank
        0's worker."""
        # as Trainer.run opens them for a new run
        stores, _ = stores_to_train_in(None, self.cfg, len(ADDRESSES), None, print)
        shards = self.trainer.parts.worker_shards(stores, None)
        host = RunHost("keys", ADDRESSES, shards)
        limit = self.trainer.parts.cluster_args()["memory_limit"]
        worker = SimpleNamespace(
            address=ADDRESSES[0],
            memory_manager=SimpleNamespace(memory_limit=limit if isinstance(limit, int) else GiB),
        )
        host.setup(worker)
        self._close.append(lambda: host.teardown(worker))
        shards.open()
        return shards

    @cached_property
    def table(self) -> Any:
        (name,) = self.host.tables
        return self.host.tables[name]

    @cached_property
    def generated(self) -> Path:
        """Where ``data.generate`` put its logs (Trainer.run calls ``ensure`` so)."""
        gen = self.cfg.data.generate
        assert gen is not None
        gen.ensure()
        (meta,) = self.tmp.rglob("generation.json")
        return meta.parent

    @cached_property
    def checkpointer(self) -> Checkpointer:
        stores, _ = stores_to_train_in(None, self.cfg, len(ADDRESSES), None, print)
        return Checkpointer(self.cfg, self.trainer.run_dir, None, stores)  # type: ignore[arg-type]


# -- probes: what each component shows of its settings -------------------------------------


def _rounded(t: torch.Tensor) -> tuple[float, ...]:
    return tuple(np.round(t.detach().cpu().numpy().ravel().astype(float), 5))


def train_days(b: Built) -> list[str | None]:
    return sorted({day_of(f) for f in b.logs[0].files})


def train_folders(b: Built) -> list[str]:
    return sorted({Path(f).parent.parent.name for f in b.logs[0].files})


def bad_row_outcome(b: Built) -> str:
    try:
        return f"skipped {b.logs[0].compute_report().total}"
    except DataError:
        return "refused"


def holdout_days(b: Built) -> list[str | None] | None:
    held = b.logs[1]
    return None if held is None else sorted({day_of(f) for f in held.files})


def holdout_share(b: Built) -> float | None:
    held = b.logs[1]
    if held is None:
        return None
    n_held, n_train = len(held.frame), len(b.logs[0].frame)
    return round(n_held / (n_held + n_train), 1)


def holdout_rows(b: Built) -> str | None:
    held = b.logs[1]
    if held is None:
        return None
    frame = held.frame.compute()
    return hashlib.sha256(frame.to_csv().encode()).hexdigest()


def holdout_is_trained(b: Built) -> bool | None:
    """Whether the held-out rows are the training rows themselves (None: nothing held)."""
    held = b.logs[1]
    if held is None:
        return None
    return bool(held.frame.compute().equals(b.logs[0].frame.compute()))


def follow_poll(b: Built) -> float:
    """The seconds ``retrain --follow`` waits after a listing of its logs found nothing new."""
    from daskhps.data.source import TrainLogs
    from daskhps.retrain.follow import follow
    from daskhps.retrain.stopping import StopRequest

    waits: list[float] = []

    class Once(StopRequest):
        def wait(self, seconds: float) -> bool:
            waits.append(seconds)
            self.set()
            return True

    empty = b.tmp / "follow-logs"
    empty.mkdir(exist_ok=True)
    cfg = dataclasses.replace(
        b.cfg,
        run=b.cfg.run.replace(dir=str(b.tmp / "follow")),
        data=b.cfg.data.replace(train=TrainLogs(paths=(str(empty),)), generate=None),
        # the follower starts its cluster before it first lists: the smallest one
        cluster=b.cfg.cluster.replace(
            n_workers=1, threads_per_worker=1, dashboard_address="127.0.0.1:0"
        ),
    )
    follow(cfg, stop=Once())
    return waits[0]


def reader_backend(b: Built) -> str:
    try:
        return b.logs[0].backend
    except ConfigError as e:
        return "refused: " + str(e).split(":")[0]


def reader_partitions(b: Built) -> int:
    return int(b.logs[0].frame.npartitions)


def schema_names(b: Built) -> tuple[str, str]:
    return b.logs[0].schema.name, b.setup.schema.name


def generated_at(b: Built) -> str:
    return str(b.generated)


def generated_days(b: Built) -> list[str]:
    return sorted(p.name for p in b.generated.glob("day=*"))


def generated_parts(b: Built) -> list[str]:
    return sorted(p.name for p in b.generated.glob("day=*/part-*"))


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).splitlines()


def generated_rows(b: Built) -> int:
    return sum(len(_lines(p)) for p in b.generated.glob("day=*/part-*"))


def generated_content(b: Built) -> str:
    h = hashlib.sha256()
    for p in sorted(b.generated.glob("day=*/part-*")):
        h.update(b"".join(_lines(p)))
    return h.hexdigest()


def generator_threads(b: Built) -> list[int]:
    """Sizes of the Dask thread pools the generator ran on: Dask keeps one per size it was
    asked for, and uses its shared default pool when no size is given."""
    for pool in dask.threaded.pools.pop(threading.current_thread(), {}).values():
        pool.shutdown()
    b.generated  # noqa: B018 (generates)
    return sorted(dask.threaded.pools.get(threading.current_thread(), {}))


def schedule_epochs(b: Built) -> list[int]:
    return sorted({epoch for epoch, _ in b.trainer.parts.schedule(b.plan)})


def pass_sizes(b: Built) -> list[int]:
    return [p.num_examples for p in b.plan.passes]


def batches(b: Built) -> tuple[int, int]:
    first = b.plan.passes[0]
    return b.trainer.parts.batches(first, 0, 100).batch_size, first.num_batches


def shuffled(b: Built) -> list[bool]:
    return [p.shuffled for p in b.plan.passes]


def key_shuffle(b: Built) -> list[str]:
    """The Dask shuffle that routes a pass's keys to their owners (as prepare_pass does)."""
    owned = plan_owner_keys(b.logs[0], b.plan, b.plan.passes[0], ShardMap(64, len(ADDRESSES)))
    names = {str(k[0] if isinstance(k, tuple) else k) for k in owned.__dask_graph__()}
    return sorted({n.split("-")[0] for n in names if "shuffle" in n.split("-")[0]})


def seeds(b: Built) -> tuple[int, int]:
    return b.setup.seed, b.plan.seed


def table_stores(b: Built) -> tuple[list[str], str]:
    return sorted(b.host.tables), str(b.host.store_path(next(iter(b.host.tables))).parents[1])


def embedding_width(b: Built) -> tuple[int, int]:
    return b.table.lookup(torch.arange(3), read_only=True).shape[1], b.setup.layout.embedding_dim


def initial_rows(b: Built) -> tuple[float, ...]:
    return _rounded(b.table.lookup(torch.arange(6), read_only=True))


def initial_bound(b: Built) -> float:
    return round(float(b.table.lookup(torch.arange(200), read_only=True).abs().max()), 2)


def sparse_updates(b: Built) -> tuple[float, ...]:
    """Two sparse-optimizer steps with different gradients (Adam's betas need two)."""
    name = next(iter(b.host.tables))
    keys = torch.arange(4)
    b.host.stage(name, keys)
    before = b.host.lookup(name, keys)
    dim = before.shape[1]
    g = torch.linspace(-1.0, 2.0, 4 * dim).reshape(4, dim)
    b.host.apply_gradients(name, keys, g)
    b.host.apply_gradients(name, keys, 0.1 - g.flip(1))
    return _rounded(b.host.lookup(name, keys) - before)


def admitted_keys(b: Built) -> list[int]:
    """Which of 400 staged keys without rows, seen 1-4 times, the shard admits."""
    import pandas as pd

    name = next(iter(b.host.tables))
    keys = torch.arange(400)
    b.host.stage(name, keys)
    part = pd.DataFrame({"key": keys.numpy(), "count": keys.numpy() % 4 + 1})
    b.host.admit(name, part)
    held = b.host.lifecycle._admitting.get(name)
    return sorted(set(range(400)) - set(held.held.tolist() if held else []))[::40]


def expired_keys(b: Built) -> list[int]:
    """Which of 300 rows (key k seen k % 7 + 1 times, last on day 700 + k % 5) the shard
    expires at the end of day 704."""
    import pandas as pd

    name = next(iter(b.host.tables))
    keys = torch.arange(300)
    b.host.stage(name, keys)
    part = pd.DataFrame(
        {"key": keys.numpy(), "count": keys.numpy() % 7 + 1, "day": 700 + keys.numpy() % 5}
    )
    b.host.admit(name, part)
    b.host.record_seen(name, part)
    before = set(b.table.store.keys().tolist()) | set(b.table.device_cache.keys().tolist())
    b.host.expire(name, 704)
    after = set(b.table.row_statistics()[0].tolist())
    return sorted(before - after)[::15]


def versions_removed(b: Built) -> list[str]:
    """Which of four published versions (v000004 current) the retention step removes."""
    from daskhps.retrain.retention import after_publish
    from daskhps.retrain.versions import Attempt, Registry, Version

    reg = Registry(b.tmp / "versions")
    for i in range(1, 5):
        name = f"v{i:06d}"
        v = Version(name, str(b.tmp / name), f"version-{name}", str(b.tmp), None, (), "d", "d")
        reg.publish(v, Attempt(name, None, (), "d", "published", version=name))
    return after_publish(reg, b.cfg.retrain.keep_versions)


def device_rows(b: Built) -> int:
    return int(b.table.device_cache.capacity_rows)


def host_bytes(b: Built) -> int:
    return 0 if b.table.host is None else int(b.table.host.capacity_bytes)


def policies(b: Built) -> tuple[str, str | None]:
    host = b.table.host
    return b.table.device_cache.policy, None if host is None else host.policy


def snapshot_commits(b: Built) -> list[int]:
    """Which of 8 commits (each updating a few rows) wrote a full index snapshot."""
    name = next(iter(b.host.tables))
    b.host.stage(name, torch.arange(100))
    dim = b.table.spec.dim
    out = []
    for i in range(8):
        b.host.apply_gradients(name, torch.arange(i, i + 2), torch.ones(2, dim))
        b.host.commit(f"c{i}")
        out += [i] if b.table.commits()[-1].snapshot else []
    return out


def sized_keys(b: Built) -> int | None:
    return check_fits(b.cfg).keys.distinct_keys  # Trainer.run's early check, daskhps plan


def model_class(b: Built) -> tuple[str, str]:
    return b.setup.model.name, type(b.model).__name__


def model_params(b: Built) -> int:
    return sum(p.numel() for p in b.model.parameters())


def dense_optimizer(b: Built) -> dict[str, Any]:
    s = b.setup
    return {"kind": s.optimizer, "lr": (s.lr, learning_rates(b)[0]),
            "weight_decay": s.weight_decay, "grad_clip_norm": s.grad_clip_norm}  # fmt: skip


def learning_rates(b: Built) -> tuple[float, ...]:
    spec = b.plan.passes[0]
    return tuple(round(x, 8) for x in b.trainer.parts.batches(spec, 0, 4).lrs)


def cluster_args(b: Built) -> dict[str, Any]:
    return b.trainer.parts.cluster_args()


def storage_options(b: Built) -> tuple[Any, Any]:
    import fsspec

    # ftp: a protocol no other test reaches, so the process-wide option changes nothing else.
    return b.trainer.parts.cluster_args()["storage_options"], fsspec.config.conf.get("ftp")


def comm_args(b: Built) -> dict[str, Any]:
    return b.trainer.parts.comm_args()


def recovery_args(b: Built) -> dict[str, Any]:
    return b.trainer.parts.recovery_args()


def evaluation(b: Built) -> dict[str, Any]:
    pred = np.array([0.1, 0.8, 0.3, 0.6])
    label = np.array([0.0, 1.0, 0.0, 1.0])
    parts = b.trainer.parts
    return {
        "every_pass": parts.evaluates_each_pass({}),  # type: ignore[arg-type]  # a placed holdout
        "batch_size": parts.holdout_batch_size(2),
        "metrics": sorted(parts.score(pred, label)),
    }


# Four evaluated passes: AUC rises then wavers while the logloss jumps at the last.
_HOLDOUT = [(0.70, 0.50), (0.72, 0.52), (0.71, 0.49), (0.715, 0.80)]


def holdout_watch(b: Built) -> dict[str, Any]:
    """The run's model and where the run stops, as the trainer's holdout watch decides them
    over :data:`_HOLDOUT` (each pass checkpointed, but a diverged one)."""
    watch = ModelWatch(b.cfg.eval)
    stops: list[str | None] = []
    for n, (auc, loss) in enumerate(_HOLDOUT, start=1):
        metrics = {"auc": auc, "logloss": loss, "ne": loss / 0.56, "ctr": 0.25}
        stop = watch.observe(n, 0.5, metrics)
        stops.append(stop.kind if stop is not None else None)
        if stop is None or stop.kind == "early":
            watch.checkpointed(ck.checkpoint_name(n), n, metrics)
        if stop is not None:
            break
    return {"model": watch.best.checkpoint if watch.best else None, "stops": stops}


def checkpoints_due(b: Built) -> list[tuple[int, str]]:
    c = b.checkpointer
    return [(n, c.kind(n)) for n in range(1, 9) if c.due(Position(n, 8, 1, n, n))]


def checkpoints_kept(b: Built) -> list[str]:
    """Checkpoint names left after the checkpointer prunes five."""
    cfg = b.cfg
    for n in range(1, 6):
        folder = writing.start_checkpoint(b.trainer.run_dir, ck.checkpoint_name(n))
        files = writing.write_payload(folder, model={}, optimizer={}, rng=[], state={})
        fields = {
            "kind": "base",
            "passes_done": n,
            "step": n,
            "commit": folder.name,
            "stores_dir": str(b.tmp / "elsewhere" / str(n)),  # none of them is the run's own
            "num_workers": 2,
            "num_shards": 64,
            "table": cfg.table_spec().layout(),
            "config": cfg.to_dict(),
        }
        writing.finish_checkpoint(folder, files, fields)
    b.checkpointer.prune()
    return [c.name for c in ck.list_checkpoints(b.trainer.run_dir)]


def replica(b: Built) -> str | None:
    """Where the checkpointer copies each checkpoint (its Replica's URL), None: nowhere."""
    r = b.trainer.parts.replica()
    return None if r is None else r.url


def guard(b: Built) -> tuple[bool, int, int]:
    """What the publish guard (daskhps retrain: judge(..., config.retrain)) says of a fixed
    candidate and baseline."""
    v = judge({"auc": 0.70, "logloss": 0.50}, {"auc": 0.71, "logloss": 0.45}, b.cfg.retrain)
    return v.publish, len(v.passed), len(v.failed)


def progress(b: Built) -> bool:
    return Trainer(b.cfg).progress  # the terminal progress unless told otherwise


def run_identity(b: Built) -> tuple[str, str, str]:
    t = b.trainer
    return t.run_id.rsplit("-", 1)[0], b.setup.run_id.rsplit("-", 1)[0], str(t.run_dir)


# The listed tables: until training takes several tables, each key lands in the resolved view
# the run builds its tables from (RunConfig.embedding_tables, field_tables, table_specs) and in
# the table components made from it: initial rows, the sparse optimizer, the admission and
# expiry rules of the first listed table.


def table_layouts(b: Built) -> list[tuple[str, int, int]]:
    """The tables the trainer's shards hold."""
    return [(s.name, s.dim, s.width) for s in b.host.specs.values()]


def field_tables(b: Built) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
    """Each field's table, as the parser tags its keys, and its width, as the model reads it."""
    return b.setup.schema.field_keys.tables, b.setup.layout.field_dims


def shared_keys(b: Built) -> tuple[str, ...]:
    """The name each field's keys are salted with when the logs are parsed."""
    return b.setup.schema.field_keys.salts


def _listed(b: Built) -> str:
    return next(iter(b.host.specs))


def listed_initial_rows(b: Built) -> tuple[float, ...]:
    spec = b.host.specs[_listed(b)]
    return _rounded(table_initial_rows(spec, torch.arange(40), state=False))


def listed_updates(b: Built) -> tuple[float, ...]:
    """Two steps of the first listed table's sparse optimizer on its initial rows."""
    spec = b.host.specs[_listed(b)]
    rows = table_initial_rows(spec, torch.arange(4))[:, : spec.stats_at].clone()
    before = rows.clone()
    g = torch.linspace(-1.0, 2.0, 4 * spec.dim).reshape(4, spec.dim)
    apply_update(spec.optimizer, rows, g, spec.dim)
    apply_update(spec.optimizer, rows, 0.1 - g.flip(1), spec.dim)
    return _rounded(rows - before)


def listed_tiers(b: Built) -> tuple[int, int, str, str | None]:
    """The first listed table's device rows, host bytes and policies, as its shard opened."""
    t = b.host.tables[_listed(b)]
    host = t.host
    return (
        int(t.device_cache.capacity_rows),
        0 if host is None else int(host.capacity_bytes),
        t.device_cache.policy,
        None if host is None else host.policy,
    )


def listed_admitted(b: Built) -> list[int]:
    """Which of 400 keys without rows, seen 1-4 times, the shards admit to the first listed
    table (all of them without a rule)."""
    keys = np.arange(400)
    rule = b.host.lifecycle.admission.get(_listed(b))
    if rule is None:
        return keys.tolist()[::40]
    ok = rule.admitted(keys, np.zeros(400), keys % 4 + 1)
    return keys[ok].tolist()[::40]


def listed_expired(b: Built) -> list[int]:
    """Which of 300 rows (as expired_keys) the shards expire from the first listed table at
    day 704 (none without a rule)."""
    keys = np.arange(300)
    rule = b.host.lifecycle.expiry.get(_listed(b))
    if rule is None:
        return []
    out = rule.expired(keys, keys % 7 + 1, 700 + keys % 5, 704)
    return keys[out].tolist()[::15]


# -- the table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Landing:
    where: str  # the component, in words, for whoever reviews this table
    probe: Callable[[Built], Any]
    set: tuple[str, ...]  # overrides giving the key a non-default value (the key among them)
    expect: Any = CHANGED  # the probe's result on the variant ("{tmp}" is its folder)
    base: tuple[str, ...] = ()  # overrides of both configs (what the key needs to matter)
    on: str = "train"  # the base config: "train" (files) or "generate"
    pick: str | None = None  # compare only this item of a dict result


def L(where: str, probe: Callable[[Built], Any], *set_: str, **kw: Any) -> Landing:
    return Landing(where, probe, tuple(set_), **kw)


_ENTRY = {"name": "probe", "features": ["C1", "C2"]}


def _tables(**change: Any) -> str:
    """``--set tables=[...]`` of one listed table, ``_ENTRY`` changed so (a list is set whole;
    braces doubled for the landing's format)."""
    text = json.dumps([{**_ENTRY, **change}]).replace("{", "{{").replace("}", "}}")
    return f"tables={text}"


def T(probe: Callable[[Built], Any], base: dict[str, Any] | None = None, **change: Any) -> Landing:
    """A key of the listed table: the variant changes ``_ENTRY`` (over ``base``)."""
    base = base or {}
    return L(TABLES, probe, _tables(**{**base, **change}), base=(_tables(**base),))


DEV = "the trainer's WorkerShards, opened on rank 0"
GEN = "the log generator (data.generate.ensure, as Trainer.run calls it)"
READ = "the click-log reader (read_train_and_holdout, as Trainer.run calls it)"
CLUSTER = "start_cluster's arguments (RunParts.cluster_args)"
# A tls:// address needs all three files; each subkey then replaces one of these.
_SECURITY = ClusterSecurity(ca_file="a", cert_file="b", key_file="c")
_TLS = (
    "cluster.address=tls://10.1.2.3:8786",
    "cluster.security={{ca_file: a, cert_file: b, key_file: c}}",
)
SETUP = "the dense-replica setup handed to every rank (RunParts.train_setup)"
OPT = "the sparse optimizer of the table shard"
TABLES = "the run's embedding tables (RunConfig.embedding_tables, table_specs) and their rules"
# cudf is the non-default reader that can be told apart from auto on a machine without cudf;
# with cudf, auto picks it, and pandas is the one to ask for.
BACKEND = "pandas" if cudf_available() else "cudf"

LANDINGS: dict[str, Landing] = {
    "run.name": L("Trainer.run_id and the workers' run id", run_identity, "run.name=probe"),
    "run.dir": L("Trainer.run_dir", run_identity, "run.dir={tmp}/there"),
    "run.seed": L(f"{SETUP} and the pass plan", seeds, "run.seed=7", expect=(7, 7)),
    "run.quiet": L("the trainer's progress output", progress, "run.quiet=true", expect=False),
    "data.train.paths": L(READ, train_folders, "data.train.paths={other}", expect=["other"]),
    "data.train.days": L(
        READ,
        train_days,
        "data.train.days=[2024-01-01, 2024-01-02]",
        expect=["2024-01-01", "2024-01-02"],
    ),
    "data.train.require_complete": L(
        READ, train_days, "data.train.require_complete=true", expect=["2024-01-01", "2024-01-02"]
    ),
    "data.generate.out": L(
        GEN, generated_at, "data.generate.out={tmp}/gen", on="generate", expect="{tmp}/gen"
    ),
    "data.generate.workers": L(
        GEN, generator_threads, "data.generate.workers=3", on="generate", expect=[3]
    ),
    "data.generate.days": L(GEN, generated_days, "data.generate.days=2", on="generate"),
    "data.generate.rows_per_day": L(
        GEN, generated_rows, "data.generate.rows_per_day=70", on="generate", expect=70
    ),
    "data.generate.parts_per_day": L(
        GEN, generated_parts, "data.generate.parts_per_day=3", on="generate"
    ),
    "data.generate.seed": L(GEN, generated_content, "data.generate.seed=5", on="generate"),
    "data.generate.start_day": L(
        GEN,
        generated_days,
        "data.generate.start_day=2023-05-06",
        on="generate",
        expect=["day=2023-05-06"],
    ),
    "data.generate.exponent": L(
        GEN, generated_content, "data.generate.exponent=2.0", on="generate"
    ),
    "data.generate.vocab_scale": L(
        GEN, generated_content, "data.generate.vocab_scale=0.5", on="generate"
    ),
    "data.generate.signal": L(GEN, generated_content, "data.generate.signal=0.0", on="generate"),
    "data.generate.ctr": L(GEN, generated_content, "data.generate.ctr=0.5", on="generate"),
    "data.generate.gzip": L(GEN, generated_parts, "data.generate.gzip=true", on="generate"),
    "data.generate.drift": L(
        GEN,
        generated_content,
        "data.generate.drift=0.5",
        base=("data.generate.start_day=2024-03-01",),  # day 0 is every slot's first key
        on="generate",
    ),
    "data.generate.one_off": L(GEN, generated_content, "data.generate.one_off=0.5", on="generate"),
    "data.schema": L(
        f"{READ} and {SETUP}",
        schema_names,
        "data.schema={tmp}/probe.yaml",
        expect=("probe", "probe"),
    ),
    "data.bad_rows.action": L(READ, bad_row_outcome, "data.bad_rows.action=fail", expect="refused"),
    "data.bad_rows.max_fraction": L(
        READ, bad_row_outcome, "data.bad_rows.max_fraction=0.001", expect="refused"
    ),
    "data.holdout.day": L(READ, holdout_days, "data.holdout.day=2024-01-02", expect=["2024-01-02"]),
    "data.holdout.fraction": L(READ, holdout_share, "data.holdout.fraction=0.5", expect=0.5),
    "data.holdout.progressive": L(
        READ, holdout_is_trained, "data.holdout.progressive=true", expect=True
    ),
    "data.holdout.seed": L(
        READ, holdout_rows, "data.holdout.seed=5", base=("data.holdout.fraction=0.5",)
    ),
    "data.backend": L(READ, reader_backend, f"data.backend={BACKEND}"),
    "data.block_size": L(READ, reader_partitions, "data.block_size=4096"),
    "passes.epochs": L("the trainer's schedule", schedule_epochs, "passes.epochs=2", expect=[0, 1]),
    "passes.examples_per_pass": L("the pass plan", pass_sizes, "passes.examples_per_pass=300"),
    "passes.global_batch_size": L(
        "the pass plan and what each rank's loop gets per pass (RunParts.batches)",
        batches,
        "passes.global_batch_size=25",
        expect=(25, 8),
    ),
    "passes.max_working_set": L("the pass plan", pass_sizes, "passes.max_working_set=900"),
    "passes.num_shards": L(SETUP, lambda b: b.setup.num_shards, "passes.num_shards=16", expect=16),
    "passes.shuffle_examples": L("the pass plan", shuffled, "passes.shuffle_examples=true"),
    "passes.shuffle_method": L(
        "the Dask shuffle of a pass's keys to their owners",
        key_shuffle,
        "passes.shuffle_method=tasks",
        expect=["taskshuffle"],
    ),
    "table.name": L(DEV, table_stores, "table.name=probe"),
    "table.dim": L(f"{DEV} and {SETUP}", embedding_width, "table.dim=8", expect=(8, 8)),
    "table.optimizer.kind": L(OPT, sparse_updates, "table.optimizer.kind=sgd"),
    "table.optimizer.lr": L(OPT, sparse_updates, "table.optimizer.lr=0.5"),
    "table.optimizer.row_wise": L(OPT, sparse_updates, "table.optimizer.row_wise=true"),
    "table.optimizer.eps": L(OPT, sparse_updates, "table.optimizer.eps=1.0"),
    "table.optimizer.initial_accumulator": L(
        OPT, sparse_updates, "table.optimizer.initial_accumulator=1.0"
    ),
    "table.optimizer.beta1": L(
        OPT, sparse_updates, "table.optimizer.beta1=0.5", base=("table.optimizer.kind=adam",)
    ),
    "table.optimizer.beta2": L(
        OPT, sparse_updates, "table.optimizer.beta2=0.5", base=("table.optimizer.kind=adam",)
    ),
    "table.seed": L(f"{DEV}: the initial rows", initial_rows, "table.seed=3"),
    "table.init_scale": L(
        f"{DEV}: the initial rows", initial_bound, "table.init_scale=0.01", expect=0.01
    ),
    "table.admission.min_count": L(
        f"{DEV}: which keys get rows", admitted_keys, "table.admission.min_count=3"
    ),
    "table.admission.probability": L(
        f"{DEV}: which keys get rows", admitted_keys, "table.admission.probability=0.5"
    ),
    "table.expiry.ttl_days": L(
        f"{DEV}: which rows leave the table", expired_keys, "table.expiry.ttl_days=2"
    ),
    "table.expiry.max_rows": L(
        f"{DEV}: which rows leave the table", expired_keys, "table.expiry.max_rows=100"
    ),
    "table.expiry.score": L(
        f"{DEV}: which rows leave the table",
        expired_keys,
        "table.expiry.score=lru",
        base=("table.expiry.max_rows=100",),
    ),
    "table.tiers.device.rows": L(
        f"{DEV}: its device tier", device_rows, "table.tiers.device.rows=500", expect=500
    ),
    "table.tiers.device.fraction": L(
        f"{DEV}: its device tier",
        device_rows,
        "table.tiers.device.fraction=0.0005",
        "table.tiers.device.rows=null",
    ),
    "table.tiers.host.fraction": L(
        f"{DEV}: its host tier", host_bytes, "table.tiers.host.fraction=0.0", expect=0
    ),
    "table.tiers.policy": L(
        f"{DEV}: device and host tiers", policies, "table.tiers.policy=lfu", expect=("lfu", "lfu")
    ),
    "table.tiers.store_dir": L(
        DEV,
        table_stores,
        "table.tiers.store_dir={tmp}/elsewhere",
        expect=(["embeddings"], "{tmp}/elsewhere"),
    ),
    "table.tiers.snapshot_every": L(
        f"{DEV}: its zarr store's commits",
        snapshot_commits,
        "table.tiers.snapshot_every=2",
        expect=[1, 3, 5, 7],
    ),
    "table.expected_keys": L(
        "the capacity check of train and daskhps plan",
        sized_keys,
        "table.expected_keys=12345",
        expect=12345,
        base=("table.tiers.device.rows=4000",),  # a pass fits: the check passes
    ),
    "tables.name": T(table_layouts, name="other"),
    "tables.dim": T(table_layouts, dim=8),
    "tables.features": T(field_tables, features=["C1", "C3"]),
    "tables.shared_keys": T(shared_keys, shared_keys=True),
    "tables.optimizer.kind": T(listed_updates, optimizer={"kind": "sgd"}),
    "tables.optimizer.lr": T(listed_updates, optimizer={"lr": 0.5}),
    "tables.optimizer.row_wise": T(listed_updates, optimizer={"row_wise": True}),
    "tables.optimizer.eps": T(listed_updates, optimizer={"eps": 1.0}),
    "tables.optimizer.initial_accumulator": T(
        listed_updates, optimizer={"initial_accumulator": 1.0}
    ),
    "tables.optimizer.beta1": T(
        listed_updates, {"optimizer": {"kind": "adam"}}, optimizer={"kind": "adam", "beta1": 0.5}
    ),
    "tables.optimizer.beta2": T(
        listed_updates, {"optimizer": {"kind": "adam"}}, optimizer={"kind": "adam", "beta2": 0.5}
    ),
    "tables.init_scale": T(listed_initial_rows, init_scale=0.01),
    "tables.seed": T(listed_initial_rows, seed=3),
    "tables.admission.min_count": T(listed_admitted, admission={"min_count": 3}),
    "tables.admission.probability": T(listed_admitted, admission={"probability": 0.5}),
    "tables.expiry.ttl_days": T(listed_expired, expiry={"ttl_days": 2}),
    "tables.expiry.max_rows": T(listed_expired, expiry={"max_rows": 100}),
    "tables.tiers.device.rows": T(listed_tiers, tiers={"device": {"rows": 500}}),
    "tables.tiers.device.fraction": T(listed_tiers, tiers={"device": {"fraction": 0.0005}}),
    "tables.tiers.host.fraction": T(listed_tiers, tiers={"host": {"fraction": 0.01}}),
    "tables.tiers.policy": T(listed_tiers, tiers={"policy": "lfu"}),
    "tables.expiry.score": T(
        listed_expired, {"expiry": {"max_rows": 100}}, expiry={"max_rows": 100, "score": "lru"}
    ),
    "model.name": L(SETUP, model_class, "model.name=deepfm", expect=("deepfm", "DeepFM")),
    "model.options": L(SETUP, model_params, "model.options.bottom_mlp=[8]"),
    "dense_optimizer.kind": L(
        SETUP, dense_optimizer, "dense_optimizer.kind=sgd", pick="kind", expect="sgd"
    ),
    "dense_optimizer.lr": L(
        SETUP, dense_optimizer, "dense_optimizer.lr=0.05", pick="lr", expect=(0.05, 0.05)
    ),
    "dense_optimizer.weight_decay": L(
        SETUP, dense_optimizer, "dense_optimizer.weight_decay=0.1", pick="weight_decay", expect=0.1
    ),
    "dense_optimizer.grad_clip_norm": L(
        SETUP,
        dense_optimizer,
        "dense_optimizer.grad_clip_norm=1.0",
        pick="grad_clip_norm",
        expect=1.0,
    ),
    "dense_optimizer.schedule": L(
        "each step's learning rate (RunParts.batches)",
        learning_rates,
        "dense_optimizer.schedule=cosine",
    ),
    "dense_optimizer.warmup_steps": L(
        "each step's learning rate (RunParts.batches)",
        learning_rates,
        "dense_optimizer.warmup_steps=2",
        base=("dense_optimizer.schedule=cosine",),
    ),
    "cluster.address": L(
        CLUSTER,
        cluster_args,
        "cluster.address=tcp://10.1.2.3:8786",
        pick="address",
        expect="tcp://10.1.2.3:8786",
    ),
    "cluster.n_workers": L(
        CLUSTER, cluster_args, "cluster.n_workers=3", pick="n_workers", expect=3
    ),
    "cluster.threads_per_worker": L(
        CLUSTER, cluster_args, "cluster.threads_per_worker=2", pick="threads_per_worker", expect=2
    ),
    "cluster.memory_limit": L(
        CLUSTER, cluster_args, "cluster.memory_limit=256MiB", pick="memory_limit", expect=256 << 20
    ),
    "cluster.processes": L(
        CLUSTER, cluster_args, "cluster.processes=false", pick="processes", expect=False
    ),
    "cluster.dashboard_address": L(
        CLUSTER,
        cluster_args,
        "cluster.dashboard_address=127.0.0.1:0",
        pick="dashboard_address",
        expect="127.0.0.1:0",
    ),
    "cluster.gpu": L(CLUSTER, cluster_args, "cluster.gpu=true", pick="gpus", expect=True),
    "cluster.security": L(
        CLUSTER,
        cluster_args,
        "cluster.security={{ca_file: ca.pem, cert_file: c.pem, key_file: k.pem}}",
        base=_TLS,
        pick="security",
        expect=ClusterSecurity(ca_file="ca.pem", cert_file="c.pem", key_file="k.pem"),
    ),
    **{
        f"cluster.security.{key}": L(
            CLUSTER,
            cluster_args,
            f"cluster.security.{key}=new.pem",
            base=_TLS,
            pick="security",
            expect=_SECURITY.model_copy(update={key: "new.pem"}),
        )
        for key in ClusterSecurity.model_fields
    },
    "cluster.dist_backend": L(
        "the process group's arguments",
        comm_args,
        "cluster.dist_backend=gloo",
        pick="backend",
        expect="gloo",
    ),
    "cluster.dist_timeout_s": L(
        "the process group's arguments",
        comm_args,
        "cluster.dist_timeout_s=5",
        pick="timeout_s",
        expect=5.0,
    ),
    "cluster.max_restarts": L(
        "the trainer's recovery from lost workers",
        recovery_args,
        "cluster.max_restarts=0",
        pick="max_restarts",
        expect=0,
    ),
    "cluster.restart_wait_s": L(
        "the trainer's recovery from lost workers",
        recovery_args,
        "cluster.restart_wait_s=7",
        pick="wait_s",
        expect=7.0,
    ),
    "eval.every_pass": L(
        "the trainer's evaluation",
        evaluation,
        "eval.every_pass=false",
        pick="every_pass",
        expect=False,
    ),
    "eval.batch_size": L(
        "the trainer's evaluation", evaluation, "eval.batch_size=100", pick="batch_size", expect=200
    ),
    "eval.metrics": L(
        "the trainer's evaluation",
        evaluation,
        "eval.metrics=[auc]",
        pick="metrics",
        expect=["auc", "ctr", "examples", "logloss"],  # logloss: eval.diverge_factor reads it
    ),
    "eval.best_by": L(
        "the trainer's holdout watch",
        holdout_watch,
        "eval.best_by=logloss",
        expect={"model": "pass-000003", "stops": [None, None, None, "diverged"]},
    ),
    "eval.patience": L(
        "the trainer's holdout watch",
        holdout_watch,
        "eval.patience=1",
        expect={"model": "pass-000002", "stops": [None, None, "early"]},
    ),
    "eval.min_delta": L(
        "the trainer's holdout watch",
        holdout_watch,
        "eval.min_delta=0.05",
        pick="model",
        expect="pass-000001",
    ),
    "eval.diverge_factor": L(
        "the trainer's holdout watch",
        holdout_watch,
        "eval.diverge_factor=3",
        pick="stops",
        expect=[None, None, None, None],
    ),
    "checkpoint.every_passes": L("the checkpointer", checkpoints_due, "checkpoint.every_passes=2"),
    "checkpoint.full_every": L("the checkpointer", checkpoints_due, "checkpoint.full_every=2"),
    "checkpoint.keep": L(
        "the checkpointer", checkpoints_kept, "checkpoint.keep=1", expect=["pass-000005"]
    ),
    "checkpoint.replicate_to": L(
        "the checkpointer's copy",
        replica,
        "checkpoint.replicate_to=file://{tmp}/copy",
        expect="file://{tmp}/copy",
    ),
    "storage.options": L(
        "the workers' setup plugin (RunParts.cluster_args) and this process's fsspec config",
        storage_options,
        "storage.options={{ftp: {{timeout: 7}}}}",
        expect=({"ftp": {"timeout": 7}}, {"timeout": 7}),
    ),
    "retrain.max_auc_drop": L("the publish guard", guard, "retrain.max_auc_drop=0.05"),
    "retrain.max_logloss_rise": L("the publish guard", guard, "retrain.max_logloss_rise=0.01"),
    "retrain.min_auc": L("the publish guard", guard, "retrain.min_auc=0.8"),
    "retrain.poll_seconds": L(
        "the follower's wait between listings", follow_poll, "retrain.poll_seconds=7", expect=7
    ),
    "retrain.keep_versions": L(
        "the retention step after a publish",
        versions_removed,
        "retrain.keep_versions=2",
        expect=["v000001", "v000002"],
    ),
}


# -- the configs and the logs they read ------------------------------------------------------


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three days of logs, the third incomplete (no _SUCCESS), one bad row; another folder."""
    root = tmp_path_factory.mktemp("landing-logs")
    cfg = GeneratorConfig(days=3, rows_per_day=100, parts_per_day=2, vocab_scale=0.01)
    generate(cfg, root / "logs")
    (root / "logs" / "day=2024-01-03" / "_SUCCESS").unlink()
    with (root / "logs" / "day=2024-01-01" / "part-00000.tsv").open("a") as f:
        f.write("not\ta\trow\n")
    generate(GeneratorConfig(days=1, rows_per_day=50, parts_per_day=1, vocab_scale=0.01),
             root / "other")  # fmt: skip
    return {"logs": root / "logs", "other": root / "other"}


def _base(on: str, tmp: Path, logs: dict[str, Path]) -> dict[str, Any]:
    data: dict[str, Any]
    if on == "train":
        data = {"train": {"paths": str(logs["logs"])}}
    else:
        data = {"generate": {"rows_per_day": 40, "parts_per_day": 2, "vocab_scale": 0.01}}
    return {
        "run": {"name": "landing", "dir": str(tmp / "run")},
        "data": data,
        "passes": {"examples_per_pass": 200, "global_batch_size": 50},
        # small tiers on the stand-in worker's 1 GiB
        "table": {"tiers": {"device": {"rows": 1000}, "host": {"fraction": 0.001}}},
        "cluster": {"gpu": False},  # the same components on every machine
    }


class Observer:
    def __init__(self, tmp: Path, logs: dict[str, Path]) -> None:
        self.tmp = tmp
        self.logs = logs
        schema = criteo_schema().to_dict()
        schema["name"] = "probe"
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "probe.yaml").write_text(dump_yaml(schema))

    def fill(self, text: Any, tmp: Path) -> Any:
        if isinstance(text, str):
            return text.format(tmp=tmp, other=self.logs["other"])
        if isinstance(text, (list, tuple)):
            return type(text)(self.fill(t, tmp) for t in text)
        return text

    def observe(self, land: Landing, overrides: tuple[str, ...], name: str) -> Any:
        tmp = self.tmp / name
        tmp.mkdir()
        shutil.copy(self.tmp / "probe.yaml", tmp / "probe.yaml")
        cfg = RunConfig.from_dict(
            _base(land.on, tmp, self.logs), overrides=[self.fill(o, tmp) for o in overrides]
        )
        built = Built(cfg, tmp)
        try:
            got = land.probe(built)
        finally:
            built.close()
        return got[land.pick] if land.pick else got


@pytest.fixture
def observer(tmp_path: Path, logs: dict[str, Path]) -> Iterator[Observer]:
    yield Observer(tmp_path, logs)


# -- the tests -------------------------------------------------------------------------------


def test_every_reference_key_has_a_landing() -> None:
    documented = {k for k in all_keys() if "." in k}  # every key of the reference
    assert set(LANDINGS) | set(SECTIONS) == documented, (
        "a config key without a landing (add it to LANDINGS with a probe of the component it "
        f"configures): {sorted(documented - set(LANDINGS) - set(SECTIONS))}; "
        f"rows for keys that are not in the reference: {sorted(set(LANDINGS) - documented)}"
    )
    for section, key in SECTIONS.items():
        assert key in LANDINGS and key.startswith(section + "."), section


@pytest.mark.parametrize("key", sorted(LANDINGS))
def test_variant_sets_the_key_to_a_non_default_value(key: str) -> None:
    values = dict(o.split("=", 1) for o in LANDINGS[key].set)
    section, _, sub = key.partition(".")
    if section in LISTS:  # a list is set whole: the variant's entry writes the key
        (entry,) = parse_scalar(values[section].replace("{{", "{").replace("}}", "}"))
        for part in sub.split("."):
            entry = entry[part]
        return
    assert key in values or (key == "model.options" and "model.options.bottom_mlp" in values)
    if key in values and key in defaults() and "{" not in values[key]:
        assert parse_scalar(values[key]) != defaults()[key], key


@pytest.mark.parametrize("key", sorted(LANDINGS))
def test_key_reaches_its_component(key: str, observer: Observer) -> None:
    land = LANDINGS[key]
    base = observer.observe(land, land.base, "base")
    got = observer.observe(land, land.base + land.set, "variant")
    assert got != base, (
        f"{key}: {', '.join(land.set)} changed nothing in {land.where} (it got {got!r})"
    )
    if land.expect is not CHANGED:
        assert got == observer.fill(land.expect, observer.tmp / "variant"), (key, land.where)

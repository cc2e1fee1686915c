"""Multi-hot fields in the trainer: bag keys of a worker's rows, pooled embeddings, gradients
back to the table rows, and a tiny end-to-end run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from daskhps.data.hashing import hash_column, missing_key
from daskhps.data.schema import LABEL, Schema, load_schema
from daskhps.distributed import Exchange
from daskhps.sharding import ShardMap
from daskhps.table import EmbeddingTable, TableSpec
from daskhps.table.optimizers import OptimizerSpec
from daskhps.training.examples import RANK, WorkerExamples, bag_keys
from daskhps.training.model_input import BagPooling, bag_pooling, batch_forward
from tests._clusters import SharedClusters
from tests._runs import tiny_config

ROOT = Path(__file__).resolve().parents[2]
DIM = 4


def _schema(tags_pooling: str = "mean", more_pooling: str = "mean") -> Schema:
    return Schema.from_dict(
        {
            "name": "mh",
            "format": "parquet",
            "label": "clicked",
            "dense": ["x"],
            "categorical": [
                "ad",
                {"name": "tags", "separator": "|", "pooling": tags_pooling},
                "user",
                {"name": "more", "separator": ",", "pooling": more_pooling},
            ],
        }
    )


def _frame(list_kind: str) -> pd.DataFrame:
    """Six rows, sorted by rank, two per global batch of 2; empty and missing cells included."""
    tags: list[Any] = [[1, 2, 3], [], None, [4], [5, 5], [6]]
    more: list[Any] = [[7], [8, 9], [10, 11, 12], None, [], [13]]
    df = pd.DataFrame(
        {
            LABEL: np.array([1, 0, 0, 1, 1, 0], np.float32),
            "x": np.arange(6, dtype=np.float32),
            "ad": np.arange(100, 106, dtype=np.int64),
            "user": np.arange(200, 206, dtype=np.int64),
            RANK: np.arange(6, dtype=np.int64),
        }
    )
    for name, cells in (("tags", tags), ("more", more)):
        if list_kind == "arrow":
            arr = pa.array(cells, pa.list_(pa.int64()))
            df[name] = pd.Series(pd.arrays.ArrowExtensionArray(arr))
        else:  # what a shuffle may hand back: Python lists and numpy arrays in an object column
            df[name] = pd.Series(
                [None if c is None else np.array(c, np.int64) for c in cells], dtype=object
            )
    return df[[LABEL, "x", "ad", "tags", "user", "more", RANK]]


def _naive_bags(df: pd.DataFrame, schema: Schema) -> list[list[int]]:
    """One list of keys per (row, field), row-major: the reference for bag_keys."""
    bags = []
    for i in range(len(df)):
        for f in schema.categorical:
            v = df[f.name].iloc[i]
            if not f.multi_hot:
                bags.append([int(v)])
            elif v is None or v is pd.NA or len(v) == 0:
                bags.append([missing_key(f.name)])
            else:
                bags.append([int(k) for k in v])
    return bags


@pytest.mark.parametrize("list_kind", ["arrow", "object"])
def test_bag_keys_match_a_naive_reference(list_kind: str) -> None:
    schema, df = _schema(), _frame(list_kind)
    keys, offsets = bag_keys(df, schema)
    bags = _naive_bags(df, schema)
    assert offsets.dtype == keys.dtype == np.int64
    assert offsets.tolist() == np.concatenate([[0], np.cumsum([len(b) for b in bags])]).tolist()
    assert keys.tolist() == [k for b in bags for k in b]
    # a slice of the frame (a later batch) reads its own rows only
    sub = df.iloc[3:]
    sk, so = bag_keys(sub, schema)
    sb = _naive_bags(sub, schema)
    assert sk.tolist() == [k for b in sb for k in b]
    assert np.diff(so).tolist() == [len(b) for b in sb]


def test_worker_examples_cut_bags_by_batch() -> None:
    schema, df = _schema(), _frame("arrow")
    data = WorkerExamples.from_frame(df, schema, batch_size=2, num_batches=3)
    assert data.offsets is not None
    bags = _naive_bags(df, schema)
    nf = len(schema.categorical)
    for b in range(3):
        dense, keys, offsets, labels = data.batch(b)
        mine = bags[2 * b * nf : 2 * (b + 1) * nf]
        assert offsets is not None and int(offsets[0]) == 0
        assert np.diff(offsets.numpy()).tolist() == [len(x) for x in mine]
        assert keys.tolist() == [k for x in mine for k in x]
        assert dense[:, 0].tolist() == [2.0 * b, 2.0 * b + 1]
        assert labels.tolist() == df[LABEL].tolist()[2 * b : 2 * b + 2]


def test_single_hot_schema_keeps_the_key_matrix() -> None:
    schema = Schema.from_dict(
        {"name": "sh", "format": "parquet", "label": "c", "categorical": ["ad", "user"]}
    )
    df = _frame("arrow")[[LABEL, "ad", "user", RANK]]
    data = WorkerExamples.from_frame(df, schema, batch_size=4, num_batches=2)
    assert data.offsets is None and bag_pooling(schema) is None
    _, keys, offsets, _ = data.batch(0)
    assert offsets is None
    assert keys.tolist() == df[["ad", "user"]].to_numpy()[:4].tolist()


def test_bag_pooling_modes() -> None:
    same = bag_pooling(_schema("sum", "sum"))
    assert same == BagPooling("sum", 4)
    mixed = bag_pooling(_schema("mean", "sum"))
    assert mixed is not None and mixed.mode == "sum"
    assert mixed.mean_fields is not None
    assert mixed.mean_fields.tolist() == [False, True, False, False]


class _Capture(nn.Module):
    """Records the sparse input; its logit is a fixed linear function of it."""

    def __init__(self, num_fields: int) -> None:
        super().__init__()
        self.w = torch.linspace(-1.0, 1.0, num_fields * DIM).view(num_fields, DIM)
        self.seen: torch.Tensor | None = None

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        self.seen = sparse.detach().clone()
        return (sparse * self.w).sum((1, 2)) + dense.sum(1)


@pytest.mark.parametrize("poolings", [("mean", "sum"), ("mean", "mean"), ("sum", "sum")])
def test_batch_forward_pools_bags_and_gradients_reach_the_rows(
    tmp_path: Path, poolings: tuple[str, str]
) -> None:
    schema = _schema(*poolings)
    df = _frame("arrow")
    data = WorkerExamples.from_frame(df, schema, batch_size=6, num_batches=1)
    dense, keys, offsets, labels = data.batch(0)
    nf = len(schema.categorical)
    spec = TableSpec("t", DIM, OptimizerSpec(kind="sgd", lr=0.5), seed=3)
    with EmbeddingTable.open(spec, tmp_path / "t", device_rows=64) as table:
        before = table.peek(keys)[:, :DIM].clone()  # the embeddings
        model = _Capture(nf)
        logits, routing, leaf = batch_forward(
            model,
            Exchange(None, ShardMap(8, 1)),
            table.lookup,
            dense,
            keys,
            offsets,
            bag_pooling(schema),
        )
        # the pooled input equals a per-bag reference on the table's own rows
        assert model.seen is not None and model.seen.shape == (6, nf, DIM)
        bounds = offsets.tolist()
        for i in range(6 * nf):
            rows = before[bounds[i] : bounds[i + 1]]
            mode = schema.categorical[i % nf].pooling
            ref = rows.sum(0) if mode == "sum" else rows.mean(0)
            torch.testing.assert_close(model.seen[i // nf, i % nf], ref, rtol=1e-6, atol=1e-7)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
        loss.backward()
        assert leaf.grad is not None and leaf.grad.shape == (len(routing.keys), DIM)
        Exchange(None, ShardMap(8, 1)).push_grads(routing, leaf.grad, table.apply_gradients)
        after = table.peek(routing.keys)[:, :DIM]
        start = _rows_of(before, keys, routing.keys)
        assert bool((after != start).any(1).all()), "every key of the batch got a gradient"
        # SGD: row -= lr * grad, with grad what the leaf collected over all bags of the key
        torch.testing.assert_close(after, start - 0.5 * leaf.grad)


def _rows_of(rows: torch.Tensor, keys: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """Rows (given per key of ``keys``) of each key of ``wanted``."""
    pos = {int(k): i for i, k in enumerate(keys.tolist())}
    return rows[[pos[int(k)] for k in wanted.tolist()]]


def _write_ads_log(root: Path, rows_per_day: int = 240) -> None:
    rng = np.random.default_rng(0)
    vocab = np.array(["sport", "cars", "food", "music", "travel", "tech"])
    for d, day in enumerate(("2024-01-01", "2024-01-02")):
        n = rows_per_day
        ad = rng.integers(0, 30, n)
        n_tags = rng.integers(0, 4, n)
        tags = ["|".join(rng.choice(vocab, k, replace=False)) for k in n_tags]
        tags = [t if i % 7 else None for i, t in enumerate(tags)]  # some missing cells
        clicked = ((ad % 3 == 0) ^ (n_tags > 1)).astype(np.int64)
        out = root / f"day={day}"
        out.mkdir(parents=True)
        pq.write_table(
            pa.table(
                {
                    "clicked": clicked,
                    "price": rng.exponential(5.0, n),
                    "age": rng.integers(18, 70, n),
                    "ad_id": ad,
                    "user_id": [f"u{u}" for u in rng.integers(0, 50 + d, n)],
                    "interests": tags,
                }
            ),
            out / "part-0.parquet",
        )


def _ads_config(
    tmp_path: Path, logs: Path, clusters: SharedClusters, n_workers: int, name: str = "mh"
) -> Any:
    """The ads log's run on a shared warm cluster of ``n_workers`` (tests/_clusters.py)."""
    from daskhps.config import RunConfig

    schema = load_schema(ROOT / "configs/schemas/ads_multi_hot.yaml")
    d = tiny_config(
        tmp_path / name,
        logs,
        data={"schema": schema.to_dict(), "holdout": {"day": "last"}},
        passes={"examples_per_pass": 120, "global_batch_size": 40},
        table={"optimizer": {"lr": 0.1}, "tiers": {"device": {"rows": 10_000}}},
        cluster_section=clusters.section(workers=n_workers, threads=1),
    )
    return RunConfig.from_dict(d, source="test")


def _stored_keys(cfg: Any, n_workers: int) -> set[int]:
    """Every key committed to the table's stores, over all ranks."""
    spec = cfg.table_spec()
    out: set[int] = set()
    for rank in range(n_workers):
        path = Path(cfg.table.tiers.store_dir) / spec.name / f"rank-{rank}"
        with EmbeddingTable.open(spec, path, device_rows=16, mode="r") as table:
            out |= set(table.store.keys().tolist())
    return out


@pytest.fixture(scope="module")
def one_worker(
    tmp_path_factory: pytest.TempPathFactory, shared_clusters: SharedClusters
) -> tuple[Path, Any, Any]:
    """The ads log, trained once on one worker: its logs, config and result (read only)."""
    from daskhps.training.trainer import Trainer

    tmp = tmp_path_factory.mktemp("multi-hot")
    logs = tmp / "logs"
    _write_ads_log(logs)
    cfg = _ads_config(tmp, logs, shared_clusters, n_workers=1, name="one")
    return logs, cfg, Trainer(cfg, progress=False).run()


@pytest.mark.slow
def test_trainer_runs_a_multi_hot_log_end_to_end(one_worker: tuple[Path, Any, Any]) -> None:
    _, cfg, result = one_worker
    assert len(result.passes) == 2
    losses = [x for p in result.passes for x in p["batch_losses"]]
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert all(0.0 <= p["eval"]["auc"] <= 1.0 for p in result.passes)
    # the interest keys (and the field's missing key) were trained and committed
    stored = _stored_keys(cfg, 1)
    interests = hash_column(["sport", "cars", "food", "music", "travel", "tech"], "interests")
    assert set(interests.tolist()) | {missing_key("interests")} <= stored


def test_route_examples_carries_multi_hot_lists_across_two_workers() -> None:
    """Dask's p2p shuffle rebuilt each column's dtype from its name, which fails for Arrow list
    columns ("data type 'list<item: int64>[pyarrow]' not understood"): every multi-hot log
    trained on more than one worker crashed while routing its examples."""
    import dask
    import dask.dataframe as dd
    from distributed import Client, LocalCluster

    from daskhps.training.examples import route_examples

    df = _frame("arrow").drop(columns=[RANK])
    frame = dd.from_pandas(pd.concat([df, df], ignore_index=True), npartitions=3, sort=False)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster),
        dask.config.set({"dataframe.shuffle.method": "p2p"}),
    ):
        routed = route_examples(frame, [4, 4, 4], 0, 12, batch_size=4, num_workers=2)
        parts = [routed.get_partition(w).compute() for w in range(2)]
    assert [len(p) for p in parts] == [6, 6]  # 2 of each batch of 4 per worker
    whole = pd.concat([df, df], ignore_index=True)
    for part in parts:
        assert part["tags"].dtype == whole["tags"].dtype
        rows = whole.iloc[part[RANK].to_numpy()]
        for name in ("tags", "more"):
            assert _cells(part[name]) == _cells(rows[name])


def _cells(col: pd.Series) -> list[list[int] | None]:
    return [None if v is None or v is pd.NA else [int(k) for k in v] for v in col.tolist()]


@pytest.mark.slow
def test_two_workers_train_a_multi_hot_log_like_one(
    tmp_path: Path, shared_clusters: SharedClusters, one_worker: tuple[Path, Any, Any]
) -> None:
    """The shipped multi-hot schema on two workers (its default): same passes, same keys
    committed (split over two rank stores) and a learning curve close to one worker's."""
    from daskhps.training.trainer import Trainer

    logs, one, r1 = one_worker
    two = _ads_config(tmp_path, logs, shared_clusters, n_workers=2, name="two")
    r2 = Trainer(two, progress=False).run()
    assert len(r2.passes) == len(r1.passes) == 2
    l1 = [x for p in r1.passes for x in p["batch_losses"]]
    l2 = [x for p in r2.passes for x in p["batch_losses"]]
    assert len(l2) == len(l1) == 6 and all(np.isfinite(l2))
    np.testing.assert_allclose(l2, l1, rtol=1e-3)
    assert _stored_keys(two, 2) == _stored_keys(one, 1)


@pytest.mark.parametrize("grouped", [False, True], ids=["index_add", "grouped"])
def test_sparse_input_backward_is_deterministic_with_threads(grouped: bool) -> None:
    """Gradients of the gathered rows sum in a fixed order even with several CPU threads, so
    a rerun (or a resumed run) reproduces the model bit for bit: through index_select's
    backward, and through the grouped backward that route's position groups enable."""
    from daskhps.distributed.exchange import Routing
    from daskhps.training.model_input import sparse_input

    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    try:
        gen = torch.Generator().manual_seed(0)
        rows = torch.randn(3000, 9, generator=gen)
        inverse = torch.randint(0, 3000, (4000, 26), generator=gen)
        upstream = torch.randn(4000, 26, 9, generator=gen)
        if grouped:  # keys 0..2999 route to themselves: the same inverse, plus the groups
            routing = Exchange(None, ShardMap(8, 1)).route(inverse)
            assert torch.equal(routing.keys, torch.arange(3000))
            assert torch.equal(routing.inverse, inverse) and routing.order is not None
        else:
            routing = Routing(torch.arange(3000), inverse, [3000], torch.arange(3000), [3000])
        grads = []
        for _ in range(5):
            leaf = rows.clone().requires_grad_(True)
            out = sparse_input(leaf, routing, None, None)
            assert torch.equal(out, rows[inverse])
            (out * upstream).sum().backward()
            assert leaf.grad is not None
            grads.append(leaf.grad)
        assert all(torch.equal(grads[0], g) for g in grads[1:])
    finally:
        torch.set_num_threads(threads)

"""Export a model for serving outside daskhps: TorchScript dense model + embedding dump.

::

    <out>/
      model.pt          TorchScript (torch.jit.trace): forward(dense[B, nd], sparse[B, F, S])
                        -> logits[B]; probability = sigmoid(logit)
      keys.npy          int64[n]     every key stored at the version's commit, rank by rank
      embeddings.npy    float32[n, S]  the model's columns of each key's row (no optimizer state)
      export.json       model, commit, layout (fields in order, dims), and everything needed
                        to go from a raw log row to the inputs: the schema, each dense field's
                        clip/transform/fill, the key hash (hps64, constants, per-field salts),
                        and the initial value of a key the dump lacks

A run with several embedding tables exports a dump per table (``keys-<table>.npy``,
``embeddings-<table>.npy``, each table's keys tagged with its index as the run makes them) and
in ``export.json`` the map of each field to its table (``feature_tables``: name, index, dim,
``shared_keys``), every table's file names and initial-value rule (``tables``), and how a key
carries its table (``key_hash``). When the tables' widths differ, ``sparse`` is flat:
``sparse[B, sum of the fields' widths]``, field ``f``'s row at columns ``columns[f]``, as the
trainer builds it (daskhps.training.model_input.field_columns).

``sparse[b, f]`` is the row of the key of field ``f`` of example ``b`` (multi-hot fields: the
sum or mean of their rows, as the field's pooling says). Keys are daskhps's ``hps64`` hashes of
(field, value). A key missing from the dump was never trained: daskhps gives it its initial
value ``init_embedding(key, seed, dim, scale)``. ``export.json`` writes each of these out
(definitions and constants; daskhps.data.describe), so a serving stack can be written from
it alone (docs/serving.md).

Tracing, not scripting: the built-in models validate their inputs with Python f-strings and
daskhps errors, which ``torch.jit.script`` rejects; their forward has no data-dependent control
flow, so a trace is exact for any batch size (checked at export on a second batch size).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from daskhps._paths import check_writable_dir
from daskhps._version import __version__
from daskhps.data.describe import features, key_hash
from daskhps.errors import StoreExistsError
from daskhps.serve.stores import ShardedStores, check_stores
from daskhps.serve.version import Servable
from daskhps.table.init import init_spec

__all__ = ["EMBEDDINGS", "KEYS", "META", "MODEL", "ExportResult", "export_model"]

MODEL = "model.pt"
KEYS = "keys.npy"
EMBEDDINGS = "embeddings.npy"
META = "export.json"
_CHUNK = 1 << 20  # keys read per step: bounds memory on large tables


@dataclass(frozen=True)
class ExportResult:
    out: Path
    keys: int
    sparse_dim: int  # the widest table's, with several
    bytes: int
    tables: int = 1


def _trace(model: torch.nn.Module, num_dense: int, sparse: tuple[int, ...]) -> Any:
    gen = torch.Generator().manual_seed(0)

    def example(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, num_dense, generator=gen), torch.randn(b, *sparse, generator=gen)

    with _quiet_jit():
        return torch.jit.trace(model, example(8), check_inputs=[example(3)])


@contextlib.contextmanager
def _quiet_jit() -> Iterator[None]:
    """torch.jit is deprecated in favour of torch.export, but TorchScript is what serving
    runtimes outside Python (libtorch, Triton's PyTorch backend) load today; and the models'
    input-shape checks are constants of the trace by design (the trace is checked above)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        yield


def export_model(
    servable: Servable, out: str | os.PathLike[str], *, overwrite: bool = False
) -> ExportResult:
    """Write the TorchScript model and the embedding dump of ``servable`` to ``out``.

    Raises
    ------
    StoreExistsError
        ``out`` already holds an export and ``overwrite`` is false.
    """
    outp = Path(out)
    if (outp / META).exists() and not overwrite:
        raise StoreExistsError(
            f"export folder {outp} already holds an export ({META}); choose another folder "
            "or pass overwrite (--overwrite)"
        )
    check_writable_dir(outp, "the export", "choose a writable --out")
    cfg = servable.config
    schema = cfg.data.schema
    nd, nf = len(schema.dense_names), len(schema.categorical_names)
    spec = servable.table.spec
    several = servable.several_tables
    for table in servable.tables:
        check_stores(table, servable.name)
    widths = cfg.sparse_widths()
    sparse = (nf, spec.dim) if not several or len(set(widths)) == 1 else (sum(widths),)
    files = [_dump_names(t.spec.name if several else None) for t in servable.tables]
    opened: list[ShardedStores] = []
    try:
        for table in servable.tables:  # every store opens before anything is written
            opened.append(ShardedStores(table))
        outp.mkdir(parents=True, exist_ok=True)
        (outp / META).unlink(missing_ok=True)  # written last: a torn export has none
        model = servable.build_model()
        traced = _trace(model, nd, sparse)
        with _quiet_jit():
            torch.jit.save(traced, str(outp / MODEL))
        counts = [
            _dump(stores, outp / k, outp / e) for stores, (k, e) in zip(opened, files, strict=True)
        ]
    finally:
        for stores in opened:
            stores.close()
    meta: dict[str, Any] = {
        "daskhps_version": __version__,
        "model": servable.name,
        "model_class": cfg.model.name,
        "commit": servable.table.commit,
        "inputs": {
            "dense": {"shape": ["B", nd], "columns": list(schema.dense_names)},
            "sparse": {"shape": ["B", *sparse], "fields": list(schema.categorical_names)},
        },
        "output": "logits[B]; probability = sigmoid(logit)",
        "keys": sum(counts),
        "features": features(schema),
        "key_hash": key_hash(schema),
    }
    if not several:
        meta["unseen_keys"] = {
            "rule": "init_embedding(key, seed, dim, scale) of daskhps.table.init",
            **init_spec(spec.seed, spec.dim, spec.scale),
        }
        meta["files"] = {"model": MODEL, "keys": files[0][0], "embeddings": files[0][1]}
    else:
        _tables_meta(meta, servable, files, counts)
    (outp / META).write_text(json.dumps(meta, indent=1))
    size = sum((outp / f).stat().st_size for f in (MODEL, META, *(f for kf in files for f in kf)))
    return ExportResult(outp, sum(counts), max(widths), size, len(servable.tables))


def _dump_names(table: str | None) -> tuple[str, str]:
    """The keys and embeddings files of ``table``'s dump (None: the run's one table)."""
    if table is None:
        return KEYS, EMBEDDINGS
    return f"keys-{table}.npy", f"embeddings-{table}.npy"


def _dump(stores: ShardedStores, keys_path: Path, rows_path: Path) -> int:
    """Write every key ``stores`` hold at their commit (rank by rank) and the model's columns
    of its row; returns how many keys."""
    spec = stores.spec
    total = len(stores)
    keys_out = np.lib.format.open_memmap(keys_path, mode="w+", dtype=np.int64, shape=(total,))
    emb_out = np.lib.format.open_memmap(
        rows_path, mode="w+", dtype=np.float32, shape=(total, spec.dim)
    )
    at = 0
    for store in stores.stores:
        keys = store.keys()
        for part in keys.split(_CHUNK):
            rows = store.lookup(part).rows
            keys_out[at : at + len(part)] = part.numpy()
            emb_out[at : at + len(part)] = rows[:, : spec.dim].numpy()
            at += len(part)
    keys_out.flush()
    emb_out.flush()
    del keys_out, emb_out
    return total


def _tables_meta(
    meta: dict[str, Any], servable: Servable, files: list[tuple[str, str]], counts: list[int]
) -> None:
    """``export.json``'s sections of a run with several tables: which table each field reads,
    each table's dump and initial rows, and the flat input's columns when widths differ."""
    cfg = servable.config
    entries = cfg.embedding_tables()
    at = cfg.field_tables()
    widths = cfg.sparse_widths()
    names = cfg.data.schema.categorical_names
    meta["feature_tables"] = {
        f: {
            "table": entries[t].name,
            "index": t,
            "dim": widths[i],
            "shared_keys": bool(entries[t].shared_keys),
        }
        for i, (f, t) in enumerate(zip(names, at, strict=True))
    }
    if len(set(widths)) > 1:
        ends = np.cumsum(widths).tolist()
        meta["inputs"]["sparse"]["columns"] = {
            f: [e - w, e] for f, w, e in zip(names, widths, ends, strict=True)
        }
        meta["inputs"]["sparse"]["layout"] = (
            "flat: field f's row (its table's dim floats) at columns [start, end) of "
            "columns[f], the fields in order"
        )
    meta["tables"] = [
        {
            "name": v.spec.name,
            "index": i,
            "dim": v.spec.dim,
            "shared_keys": bool(entries[i].shared_keys),
            "fields": [f for f, t in zip(names, at, strict=True) if t == i],
            "keys": n,
            "files": {"keys": k, "embeddings": e},
            "unseen_keys": init_spec(v.spec.seed, v.spec.dim, v.spec.scale),
        }
        for i, (v, (k, e), n) in enumerate(zip(servable.tables, files, counts, strict=True))
    ]
    meta["unseen_keys"] = {
        "rule": "init_embedding(key, seed, dim, scale) of daskhps.table.init, with the tagged "
        "key and its table's seed, dim and scale (tables[i].unseen_keys)"
    }
    meta["files"] = {
        "model": MODEL,
        "tables": {
            v.spec.name: t["files"] for v, t in zip(servable.tables, meta["tables"], strict=True)
        },
    }

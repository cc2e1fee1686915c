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
from daskhps.data.describe import features
from daskhps.data.hashing import hash_spec
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
    sparse_dim: int
    bytes: int


def _trace(model: torch.nn.Module, num_dense: int, num_fields: int, sdim: int) -> Any:
    gen = torch.Generator().manual_seed(0)

    def example(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, num_dense, generator=gen), torch.randn(
            b, num_fields, sdim, generator=gen
        )

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
    check_stores(servable.table, servable.name)
    stores = ShardedStores(servable.table)
    try:
        outp.mkdir(parents=True, exist_ok=True)
        (outp / META).unlink(missing_ok=True)  # written last: a torn export has none
        model = servable.build_model()
        traced = _trace(model, nd, nf, spec.dim)
        with _quiet_jit():
            torch.jit.save(traced, str(outp / MODEL))
        total = len(stores)
        keys_out = np.lib.format.open_memmap(outp / KEYS, mode="w+", dtype=np.int64, shape=(total,))
        emb_out = np.lib.format.open_memmap(
            outp / EMBEDDINGS, mode="w+", dtype=np.float32, shape=(total, spec.dim)
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
    finally:
        stores.close()
    meta = {
        "daskhps_version": __version__,
        "model": servable.name,
        "model_class": cfg.model.name,
        "commit": servable.table.commit,
        "inputs": {
            "dense": {"shape": ["B", nd], "columns": list(schema.dense_names)},
            "sparse": {"shape": ["B", nf, spec.dim], "fields": list(schema.categorical_names)},
        },
        "output": "logits[B]; probability = sigmoid(logit)",
        "keys": total,
        "features": features(schema),
        "key_hash": hash_spec(),
        "unseen_keys": {
            "rule": "init_embedding(key, seed, dim, scale) of daskhps.table.init",
            **init_spec(spec.seed, spec.dim, spec.scale),
        },
        "files": {"model": MODEL, "keys": KEYS, "embeddings": EMBEDDINGS},
    }
    (outp / META).write_text(json.dumps(meta, indent=1))
    size = sum((outp / f).stat().st_size for f in (MODEL, KEYS, EMBEDDINGS, META))
    return ExportResult(outp, total, spec.dim, size)

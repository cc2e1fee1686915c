"""Synthetic Criteo-format click logs with a planted signal and a known AUC ceiling.

Each row: label, 13 integer counts (I1..I13) and 26 categorical values (C1..C26, 8 hex digits),
tab-separated, empty where missing, laid out as day partitions::

    OUT/day=2024-01-01/part-00000.tsv[.gz] ... part-NNNNN   rows of one day, split in parts
    OUT/day=2024-01-01/_SUCCESS                             written after every part of the day
    OUT/generation.json                                     config, rows, CTR, ceiling AUC

Categorical values follow a truncated power law (Zipf) over each field's vocabulary: rank r has
probability ~ r**-exponent, and rank r of field f is always the same hex value (so keys recur
across days, like real logs). Missing rates follow the public Criteo data.

Labels come from a known logistic model::

    logit = bias + sum_j w_j * z_j + sum_f s_f * e_f(value_f)
    z_j   = standardised log1p(max(I_j, 0)) (0 where missing), e_f = a fixed value in [-1.7, 1.7]
    label ~ Bernoulli(sigmoid(logit))

so the AUC of ``sigmoid(logit)`` on the generated rows is the best any model can reach (the
"ceiling"); it is reported in ``generation.json``, overall and per day.

Logs can drift from day to day, as real ones do (``drift`` and ``one_off``, both 0 by default,
which leaves the logs exactly as they were without them):

- ``drift`` = rho: each rank r of a field is a *slot* whose occupant (its hex value and its
  effect) changes with the slot's generation ``g = floor(day * rho + u_r)``, where u_r in [0, 1)
  is a fixed hash of (field, r). Between two days exactly a share rho of the slots, spread evenly
  over every popularity level, gets a new key: the old key dies (is never drawn again) and a new
  one, with a new effect, is born at the same popularity. Generation 0 is the value and effect
  the slot has without drift.
- ``one_off`` = s: a share s of the categorical values present is replaced by a value drawn
  uniformly from the 2**32 possible, seen (almost surely) once in the whole log: the long tail
  of keys that occur once. They carry no signal (effect 0): a key seen once cannot teach a
  model anything, so the ceiling stays a target a model can approach. Among n one-off values,
  about n**2 / 2**33 pairs collide by chance (about 0.1% of 3M).

Everything is a function of the seed: part ``(day, p)`` draws from its own
``SeedSequence([seed, day, p])``, so parts can be generated in any order, in parallel, and come
out the same.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from pydantic import Field, field_validator

from daskhps import storage
from daskhps.data.generation import GenerationSummary
from daskhps.data.hashing import fmix64
from daskhps.data.source import SUCCESS
from daskhps.options import Int, Options, Problem, shown

__all__ = ["GeneratorConfig", "generate"]

log = logging.getLogger(__name__)

NUM_DENSE, NUM_CAT = 13, 26
# Cardinalities of the Criteo Kaggle fields, capped at 1M so a laptop run stays small.
VOCAB = (1460, 583, 1_000_000, 200_000, 305, 24, 12517, 633, 3, 93145, 5683, 1_000_000,
         3194, 27, 14992, 500_000, 10, 5652, 2173, 4, 1_000_000, 18, 15, 286_181, 105,
         142_572)  # fmt: skip
CAT_MISSING = (0, 0, 0.034, 0.034, 0, 0.12, 0, 0, 0, 0, 0, 0.034, 0, 0, 0, 0.034, 0, 0,
               0.44, 0.44, 0.034, 0.76, 0, 0.034, 0.44, 0.44)  # fmt: skip
DENSE_MISSING = (0.45, 0.0, 0.21, 0.22, 0.026, 0.22, 0.04, 0.0005, 0.04, 0.45, 0.04, 0.76,
                 0.22)  # fmt: skip
HIST_BINS = 1 << 16
_EPOCH = dt.date(2024, 1, 1)
_BLOCK = 1 << 17  # rows generated and written at a time: keeps temporaries small
# Two hex digits per byte, as the uint16 whose little-endian bytes are the two characters.
_HEX2 = np.array([ord(f"{b:02x}"[0]) | (ord(f"{b:02x}"[1]) << 8) for b in range(256)], dtype="<u2")


class GeneratorConfig(Options):
    """What to generate. ``exponent`` > 0 is the power-law exponent of categorical values;
    ``signal`` scales the planted weights (0 gives labels independent of the features)."""

    days: Int = Field(1, ge=1)
    """Days to generate."""
    rows_per_day: Int = Field(100_000, ge=1)
    """Rows per day."""
    parts_per_day: Int = Field(4, ge=1)
    """Files per day."""
    seed: Int = Field(0, ge=0)
    """Generator seed (independent of `run.seed`)."""
    start_day: str = Field("2024-01-01", json_schema_extra=shown("YYYY-MM-DD"))
    """First day."""
    exponent: float = Field(1.1, gt=0.0)
    """Power-law exponent of categorical values."""
    vocab_scale: float = Field(1.0, gt=0.0)
    """Scales every field's vocabulary."""
    signal: float = Field(1.0, ge=0.0)
    """Strength of the planted signal (0: none)."""
    ctr: float = Field(0.25, gt=0.0, lt=1.0)
    """Target click-through rate."""
    gzip: bool = False
    """Write `.tsv.gz` parts."""
    drift: float = Field(0.0, ge=0.0, le=1.0)
    """Share of keys replaced by new ones each day, at every popularity (0: none)."""
    one_off: float = Field(0.0, ge=0.0, lt=1.0)
    """Share of categorical values that are one-off keys, seen once (0: none)."""

    @field_validator("start_day")
    @classmethod
    def _a_date(cls, day: str) -> str:
        try:
            dt.date.fromisoformat(day)
        except ValueError:
            raise Problem("", f"expected YYYY-MM-DD, got {day!r}") from None
        return day

    def day_numbers(self) -> list[int]:
        """Each day's number, counted from 2024-01-01 (the default first day): the clock that
        drift and one-off values follow, so logs generated a day at a time continue one another."""
        start = dt.date.fromisoformat(self.start_day).toordinal() - _EPOCH.toordinal()
        return [start + i for i in range(self.days)]

    def day_names(self) -> list[str]:
        start = dt.date.fromisoformat(self.start_day)
        return [(start + dt.timedelta(days=i)).isoformat() for i in range(self.days)]

    def vocab(self) -> np.ndarray:
        return np.maximum(np.round(np.array(VOCAB) * self.vocab_scale), 1).astype(np.int64)


@dataclass(frozen=True)
class _Model:
    """The planted logistic model, a pure function of the seed."""

    field_salts: np.ndarray  # uint64[26]: rank -> value and rank -> effect
    dense_mu: np.ndarray
    dense_sigma: np.ndarray
    dense_w: np.ndarray
    cat_scale: np.ndarray
    z_mean: np.ndarray
    z_std: np.ndarray
    bias: float


def _uniform_from(x: np.ndarray) -> np.ndarray:
    """A uint64 hash -> a float in [0, 1)."""
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SLOT_PHASE = np.uint64(0xD1B54A32D192ED03)  # u_r of a slot: hash of (field salt, rank, this)
_GENERATION = np.uint64(0xAEF17502108EF2D9)  # generation g's salt: hash of (g * this)


def _slot_salts(
    cfg: GeneratorConfig, model: _Model, f: int, rank: np.ndarray, day: int
) -> np.ndarray:
    """The salt that maps each rank of field ``f`` to its occupant on ``day`` (uint64 per row).

    Without drift it is the field's salt; with drift, the salt of the slot's generation (see
    the module's docstring), and generation 0 keeps the field's salt.
    """
    salt = model.field_salts[f]
    if cfg.drift == 0.0:
        return np.full(rank.shape, salt, dtype=np.uint64)
    with np.errstate(over="ignore"):
        phase = _uniform_from(fmix64(rank.astype(np.uint64) ^ salt ^ _SLOT_PHASE))
        g = np.floor(day * cfg.drift + phase).astype(np.int64).astype(np.uint64)
        return np.where(g == 0, salt, salt ^ fmix64(g * _GENERATION))


def _effect(salts: np.ndarray, rank: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = fmix64(rank.astype(np.uint64) * _GOLDEN ^ salts)
    return (2.0 * _uniform_from(h) - 1.0) * np.sqrt(3.0)  # mean 0, variance 1


def _value(salts: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The uint32 hex value of each rank, under its salt."""
    return fmix64(rank.astype(np.uint64) ^ salts) & np.uint64(0xFFFFFFFF)


def _make_model(cfg: GeneratorConfig) -> _Model:
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 0xC0FFEE]))
    salts = rng.integers(0, 2**63, NUM_CAT, dtype=np.uint64)
    mu = rng.uniform(0.5, 4.0, NUM_DENSE)
    sigma = rng.uniform(0.8, 1.8, NUM_DENSE)
    # Scales chosen so signal=1 gives a ceiling AUC near 0.79, about what is reported for
    # the real Criteo data.
    w = rng.normal(0, 0.21, NUM_DENSE) * cfg.signal
    scale = rng.uniform(0.09, 0.36, NUM_CAT) * cfg.signal
    # Standardise log1p(count) analytically-ish: from a pilot sample of the dense draws.
    pilot = np.log1p(np.maximum(np.floor(np.exp(mu + sigma * rng.normal(size=(20000, 1)))), 0))
    model = _Model(salts, mu, sigma, w, scale, pilot.mean(0), pilot.std(0) + 1e-6, 0.0)
    # Bias so the mean click probability is the configured CTR (bisection on a pilot block).
    _, ranks, z = _features(cfg, model, np.random.default_rng(cfg.seed), 20000)
    logit = _logit(model, _cells(cfg, model, ranks, 0, None), z)
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.mean(1 / (1 + np.exp(-(logit + mid)))) < cfg.ctr else (lo, mid)
    return _Model(**{**model.__dict__, "bias": (lo + hi) / 2})


def _sample_ranks(rng: np.random.Generator, n: int, vocab: int, a: float) -> np.ndarray:
    """Truncated continuous power law on [1, vocab + 1): P(r) ~ r**-a, floor to integers."""
    u = rng.random(n)
    top = float(vocab + 1)
    if abs(a - 1.0) < 1e-9:
        r = np.exp(u * np.log(top))
    else:
        e = 1.0 - a
        r = (u * (top**e - 1.0) + 1.0) ** (1.0 / e)
    return np.minimum(r.astype(np.int64), vocab)


def _features(
    cfg: GeneratorConfig, model: _Model, rng: np.random.Generator, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dense counts float64 with NaN for missing [n, 13], ranks [n, 26] with 0 = missing,
    z = standardised dense [n, 13])."""
    lat = model.dense_mu + model.dense_sigma * rng.standard_normal((n, NUM_DENSE))
    dense = np.floor(np.exp(lat))
    dense[:, 1] -= 3  # I2 has small negative values in the real data
    dense[rng.random((n, NUM_DENSE)) < np.array(DENSE_MISSING)] = np.nan
    z = (np.log1p(np.maximum(dense, 0)) - model.z_mean) / model.z_std
    z[np.isnan(z)] = 0.0
    vocab = cfg.vocab()
    ranks = np.empty((n, NUM_CAT), dtype=np.int64)
    for f in range(NUM_CAT):
        ranks[:, f] = _sample_ranks(rng, n, int(vocab[f]), cfg.exponent)
    ranks[rng.random((n, NUM_CAT)) < np.array(CAT_MISSING)] = 0
    return dense, ranks, z


@dataclass(frozen=True)
class _Cells:
    """The categorical cells of a block: what is written and what it contributes."""

    values: np.ndarray  # uint32 values as uint64 [n, 26]
    present: np.ndarray  # bool [n, 26]
    effects: np.ndarray  # float64 [n, 26]: e_f(value) (missing is rank 0's), 0 for a one-off


def _cells(
    cfg: GeneratorConfig,
    model: _Model,
    ranks: np.ndarray,
    day: int,
    one_offs: np.random.Generator | None,
) -> _Cells:
    """The values and effects of ``ranks`` on ``day``; one-off values drawn from ``one_offs``
    (a stream of their own, so the rest of the log is the same with or without them)."""
    n = len(ranks)
    values = np.empty((n, NUM_CAT), dtype=np.uint64)
    effects = np.empty((n, NUM_CAT), dtype=np.float64)
    for f in range(NUM_CAT):
        r = ranks[:, f]
        salts = _slot_salts(cfg, model, f, r, day)
        with np.errstate(over="ignore"):
            values[:, f] = _value(salts, r)
        effects[:, f] = _effect(salts, r)
    present = ranks > 0
    if cfg.one_off > 0.0 and one_offs is not None:
        once = present & (one_offs.random((n, NUM_CAT)) < cfg.one_off)
        values[once] = one_offs.integers(0, 1 << 32, int(once.sum()), dtype=np.uint64)
        effects[once] = 0.0
    return _Cells(values, present, effects)


def _logit(model: _Model, cells: _Cells, z: np.ndarray) -> np.ndarray:
    logit = model.bias + z @ model.dense_w
    for f in range(NUM_CAT):  # field by field: the sum's rounding is that of logs made before
        logit += model.cat_scale[f] * cells.effects[:, f]
    return logit


def _hex_column(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    """uint32 -> 8 lower-case hex digits as an Arrow string array, built from raw buffers."""
    n = len(values)
    digits = _HEX2[values.astype(">u4").view(np.uint8)]  # big-endian: most significant first
    offsets = np.arange(0, 8 * n + 1, 8, dtype=np.int32)
    bitmap = np.packbits(valid, bitorder="little")
    return pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(digits), pa.py_buffer(bitmap)
    )


def _block_table(
    cfg: GeneratorConfig,
    model: _Model,
    rng: np.random.Generator,
    n: int,
    day: int = 0,
    one_offs: np.random.Generator | None = None,
) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    dense, ranks, z = _features(cfg, model, rng, n)
    cells = _cells(cfg, model, ranks, day, one_offs)
    p = 1.0 / (1.0 + np.exp(-_logit(model, cells, z)))
    label = (rng.random(n) < p).astype(np.int64)
    cols: dict[str, pa.Array] = {"label": pa.array(label)}
    for j in range(NUM_DENSE):
        cols[f"I{j + 1}"] = pa.array(
            np.nan_to_num(dense[:, j]).astype(np.int64), mask=np.isnan(dense[:, j])
        )
    for f in range(NUM_CAT):
        cols[f"C{f + 1}"] = _hex_column(cells.values[:, f], cells.present[:, f])
    return pa.table(cols), p, label


def _write_part(
    cfg: GeneratorConfig, model: _Model, path: str, day: int, day_number: int, part: int, n: int
) -> dict[str, Any]:
    """Generate and write one part; returns its row count and label/probability histograms.

    ``day`` is the day's index in this run (the rows' stream, as it always was), ``day_number``
    its place on the calendar (which key holds each slot, and the one-off values).
    """
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, day, part]))
    # Ordinals are positive, which SeedSequence needs; day numbers before 2024 are not.
    ordinal = _EPOCH.toordinal() + day_number
    one_offs = np.random.default_rng(np.random.SeedSequence([cfg.seed, ordinal, part, 0x0FF]))
    hist = np.zeros((2, HIST_BINS), dtype=np.int64)
    remote = storage.is_url(path)
    # An object is written whole from a local file (a PUT: visible only once complete).
    tmp = tempfile.mkstemp(suffix=".tsv.part")[1] if remote else f"{path}.tmp"
    opts = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    sink: Any = pa.CompressedOutputStream(tmp, "gzip") if cfg.gzip else pa.OSFile(tmp, "wb")
    writer = None
    try:
        for lo in range(0, n, _BLOCK):
            table, p, label = _block_table(
                cfg, model, rng, min(_BLOCK, n - lo), day_number, one_offs
            )
            if writer is None:
                writer = pacsv.CSVWriter(sink, table.schema, write_options=opts)
            writer.write_table(table)
            b = np.minimum((p * HIST_BINS).astype(np.int64), HIST_BINS - 1)
            hist += np.stack([np.bincount(b[label == k], minlength=HIST_BINS) for k in (0, 1)])
    finally:
        if writer is not None:
            writer.close()
        sink.close()
    if remote:
        fs, key = storage.filesystem(path)
        try:
            fs.put_file(tmp, key)
        except Exception as e:
            raise storage.failure(path, e, "write") from None
        finally:
            os.unlink(tmp)
    else:
        os.replace(tmp, path)  # a part is visible only once complete
    return {"rows": n, "clicks": int(label_sum(hist)), "hist": hist}


def label_sum(hist: np.ndarray) -> int:
    return int(hist[1].sum())


def _put_text(path: str, text: str) -> None:
    """Write a small file, or object."""
    if not storage.is_url(path):
        Path(path).write_text(text)
        return
    fs, key = storage.filesystem(path)
    try:
        fs.pipe_file(key, text.encode())
    except Exception as e:
        raise storage.failure(path, e, "write") from None


def _finish_day(out: str, day: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    _put_text(f"{out}/day={day}/{SUCCESS}", "")
    hist = sum(p["hist"] for p in parts)
    rows = sum(p["rows"] for p in parts)
    return {"day": day, "rows": rows, "hist": hist}


def _unmark(folder: str) -> None:
    """Create ``folder`` (on disk) and remove its ``_SUCCESS`` marker."""
    if not storage.is_url(folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / SUCCESS).unlink(missing_ok=True)
        return
    fs, key = storage.filesystem(folder)
    try:
        if fs.exists(f"{key}/{SUCCESS}"):
            fs.rm_file(f"{key}/{SUCCESS}")
    except Exception as e:
        raise storage.failure(folder, e, "write") from None


def generate(
    cfg: GeneratorConfig,
    out: str | os.PathLike[str],
    scheduler: str | Any = "threads",
    num_workers: int | None = None,
    progress: bool = False,
) -> GenerationSummary:
    """Write ``cfg.days`` days of Criteo-format logs under ``out`` (a folder, or an fsspec URL
    such as ``s3://bucket/logs``) with Dask, in parallel.

    ``scheduler`` is a Dask scheduler name (``threads``, ``processes``, ``sync``) or a
    ``distributed.Client``. Existing parts of the same names are overwritten.
    """
    import dask
    from dask import delayed

    out = (
        str(out).rstrip("/")
        if storage.is_url(str(out))
        else str(Path(storage.local_path(str(out))))
    )
    model = _make_model(cfg)
    start = time.perf_counter()
    day_tasks = []
    ext = ".tsv.gz" if cfg.gzip else ".tsv"
    for d, (day, number) in enumerate(zip(cfg.day_names(), cfg.day_numbers(), strict=True)):
        folder = f"{out}/day={day}"
        _unmark(folder)  # incomplete until every part is written
        sizes = [len(a) for a in np.array_split(np.arange(cfg.rows_per_day), cfg.parts_per_day)]
        parts = [
            delayed(_write_part, pure=False)(
                cfg, model, f"{folder}/part-{p:05d}{ext}", d, number, p, sizes[p]
            )
            for p in range(cfg.parts_per_day)
            if sizes[p] > 0
        ]
        day_tasks.append(delayed(_finish_day, pure=False)(out, day, parts))
    kwargs: dict[str, Any] = {}
    if isinstance(scheduler, str):
        kwargs["scheduler"] = scheduler
        if num_workers:
            kwargs["num_workers"] = num_workers
    if progress:
        from dask.diagnostics import ProgressBar

        # stderr, beside the other bars: stdout holds what a command prints as its result
        bar = ProgressBar(out=sys.stderr) if isinstance(scheduler, str) else ProgressBar(out=None)
        with bar:
            results = dask.compute(*day_tasks, **kwargs)
    else:
        results = dask.compute(*day_tasks, **kwargs)
    seconds = time.perf_counter() - start
    summary = GenerationSummary.of_days(out, cfg, results, seconds)
    _put_text(f"{out}/generation.json", json.dumps(summary.to_dict(), indent=2) + "\n")
    log.info(
        "wrote %d rows in %.1f s (%.0f rows/s), CTR %.4f, ceiling AUC %.4f",
        summary.rows,
        seconds,
        summary.rows_per_second,
        summary.ctr,
        summary.ceiling_auc,
    )
    return summary

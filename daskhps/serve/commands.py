"""``daskhps predict`` and ``daskhps export``: arguments and runners for :mod:`daskhps.cli`."""

from __future__ import annotations

import argparse
import importlib

from daskhps.cli import non_negative_int, positive_int

__all__ = [
    "add_export_arguments",
    "add_predict_arguments",
    "add_serve_arguments",
    "run_export",
    "run_predict",
    "run_serve",
]


def _model_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        metavar="VERSION_OR_PATH",
        help="a checkpoint folder (<run dir>/checkpoints/pass-NNNNNN) or a run directory "
        "(its latest complete checkpoint); stores not on this machine are read from the run's "
        "copy at checkpoint.replicate_to",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        metavar="NAME",
        help="with a run directory as --model: use its checkpoint NAME (e.g. pass-000003) "
        "instead of the latest; `daskhps inspect RUN_DIR` lists them",
    )


def _cache_arguments(p: argparse.ArgumentParser, each: str) -> None:
    """The lookup's cache sizes and the model's batch size, held by each worker or process."""
    p.add_argument(
        "--device-rows", type=positive_int, default=1 << 20, help=f"device cache rows {each}"
    )
    p.add_argument(
        "--host-mb",
        type=non_negative_int,
        default=256,
        help=f"host-memory cache {each}, MiB (0: none)",
    )
    p.add_argument("--batch-size", type=positive_int, default=4096, help="rows per model batch")


def add_predict_arguments(p: argparse.ArgumentParser) -> None:
    _model_argument(p)
    p.add_argument(
        "--data", required=True, nargs="+", metavar="GLOB", help="click logs: files, folders, globs"
    )
    p.add_argument("--out", required=True, help="output folder (part-*.parquet, _predict.json)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS", help="an existing scheduler")
    p.add_argument(
        "--workers", type=positive_int, default=None, help="local workers (default: the config's)"
    )
    _cache_arguments(p, "per worker")
    p.add_argument(
        "--labels",
        choices=("auto", "present", "absent"),
        default="auto",
        help="whether the logs hold the label column: auto (default) decides per file, from "
        "its header, its parquet columns or its first lines' field count (one fewer than the "
        "schema's columns: no label); the label is never used",
    )
    p.add_argument("--overwrite", action="store_true", help="replace earlier predictions in --out")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def run_predict(args: argparse.Namespace) -> int:
    from daskhps.runfiles.copycache import fetched_model

    job = importlib.import_module("pipelines.predict")
    model, checkpoint = fetched_model(args.model, args.checkpoint)
    return int(
        job.run(
            model,
            list(args.data),
            args.out,
            scheduler=args.scheduler,
            workers=args.workers,
            device_rows=args.device_rows,
            host_bytes=args.host_mb << 20,
            batch_size=args.batch_size,
            overwrite=args.overwrite,
            labels=args.labels,
            as_json=args.json,
            checkpoint=checkpoint,
        )
    )


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    _model_argument(p)
    p.add_argument("--out", required=True, help="output folder (model.pt, keys.npy, ...)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")


def run_export(args: argparse.Namespace) -> int:
    from daskhps.serve import load_servable
    from daskhps.serve.export import export_model

    servable = load_servable(args.model, args.checkpoint)
    res = export_model(servable, args.out, overwrite=args.overwrite)
    rows = (
        f"{res.keys:,} keys x {res.sparse_dim} floats"
        if res.tables == 1
        else f"{res.keys:,} keys of {res.tables} tables (up to {res.sparse_dim} floats each)"
    )
    chosen = f" ({servable.chosen})" if servable.chosen else ""
    print(
        f"exported {servable.name}{chosen}: {rows} and the TorchScript model to {res.out} "
        f"({res.bytes / 2**20:.1f} MiB)"
    )
    return 0


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        metavar="VERSION_OR_RUN_OR_CHECKPOINT",
        help="a retraining run directory (serves the version CURRENT names, and follows it: "
        "publishes and rollbacks), or a version's folder, a checkpoint folder or a training "
        "run directory (its latest checkpoint; served as it is at start); stores not on this "
        "machine are read from the run's copy at checkpoint.replicate_to",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free)")
    p.add_argument(
        "--processes",
        type=positive_int,
        default=1,
        help="server processes on the one port (SO_REUSEPORT); each keeps its own caches",
    )
    p.add_argument(
        "--poll-s",
        type=float,
        default=5.0,
        help="seconds between two reads of the registry's CURRENT (default 5)",
    )
    p.add_argument(
        "--max-rows", type=positive_int, default=65536, help="rows a request at most (413 above)"
    )
    p.add_argument(
        "--max-body-mb", type=positive_int, default=64, help="request body size limit, MiB"
    )
    _cache_arguments(p, "a process")
    p.add_argument(
        "--warmup",
        default=None,
        metavar="FILE",
        help="log rows (the model's schema) scored once before /readyz says ready: they fill "
        "the caches with the keys traffic will ask for",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch threads a process for a request of 4096 rows or more (default 1; more only "
        "where the host's cores are the server's alone); a smaller one runs on one",
    )
    p.epilog = (
        'POST /predict takes {"rows": [{field: value, ...}]} or log lines '
        '(text/tab-separated-values, text/csv) and answers {"version", "probabilities"}; '
        "GET /healthz, /readyz, /metrics (Prometheus). See docs/serving.md."
    )


def run_serve(args: argparse.Namespace) -> int:
    from daskhps.serve.server import ServeOptions, serve

    if args.poll_s <= 0:
        raise SystemExit(f"daskhps serve: error: --poll-s must be > 0, got {args.poll_s}")
    if not 0 <= args.port <= 65535:
        raise SystemExit(f"daskhps serve: error: --port must be in 0..65535, got {args.port}")
    return serve(
        ServeOptions(
            model=args.model,
            host=args.host,
            port=args.port,
            processes=args.processes,
            poll_s=args.poll_s,
            max_rows=args.max_rows,
            max_body_bytes=args.max_body_mb << 20,
            batch_size=args.batch_size,
            device_rows=args.device_rows,
            host_bytes=args.host_mb << 20,
            warmup=args.warmup,
            threads=args.threads,
        )
    )

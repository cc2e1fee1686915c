"""``daskhps predict`` and ``daskhps export``: arguments and runners for :mod:`daskhps.cli`."""

from __future__ import annotations

import argparse
import importlib

from daskhps.cli import positive_int

__all__ = ["add_export_arguments", "add_predict_arguments", "run_export", "run_predict"]


def _model_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        metavar="VERSION_OR_PATH",
        help="a checkpoint folder (<run dir>/checkpoints/pass-NNNNNN) or a run directory "
        "(its latest complete checkpoint)",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        metavar="NAME",
        help="with a run directory as --model: use its checkpoint NAME (e.g. pass-000003) "
        "instead of the latest; `daskhps inspect RUN_DIR` lists them",
    )


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
    p.add_argument(
        "--device-rows", type=positive_int, default=1 << 20, help="device cache rows per worker"
    )
    p.add_argument(
        "--host-mb", type=int, default=256, help="host-memory cache per worker, MiB (0: none)"
    )
    p.add_argument("--batch-size", type=positive_int, default=4096, help="rows per batch")
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
    job = importlib.import_module("pipelines.predict")
    return int(
        job.run(
            args.model,
            list(args.data),
            args.out,
            scheduler=args.scheduler,
            workers=args.workers,
            device_rows=args.device_rows,
            host_bytes=max(args.host_mb, 0) << 20,
            batch_size=args.batch_size,
            overwrite=args.overwrite,
            labels=args.labels,
            as_json=args.json,
            checkpoint=args.checkpoint,
        )
    )


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    _model_argument(p)
    p.add_argument("--out", required=True, help="output folder (model.pt, keys.npy, ...)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")


def run_export(args: argparse.Namespace) -> int:
    from daskhps.serve import load_servable
    from daskhps.serve.export import export_model

    res = export_model(
        load_servable(args.model, args.checkpoint), args.out, overwrite=args.overwrite
    )
    print(
        f"exported {res.keys:,} keys x {res.sparse_dim} floats and the TorchScript model to "
        f"{res.out} ({res.bytes / 2**20:.1f} MiB)"
    )
    return 0

"""``daskhps import``: arguments and runner for :mod:`daskhps.cli`."""

from __future__ import annotations

import argparse
import json
import shlex

from daskhps.cli import positive_int
from daskhps.config.arguments import add_config_arguments
from daskhps.config.runconfig import load_config
from daskhps.errors import ConfigError

__all__ = ["add_import_arguments", "run_import"]


def add_import_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument(
        "--rows",
        required=True,
        nargs="+",
        action="extend",
        metavar="PATH",
        help="the embeddings: one .npy file (float32[n, table.dim], e.g. an export's "
        "embeddings.npy; keys from --keys), or parquet files, folders or globs (a key column "
        "and the embedding; see docs/serving.md). A config with several tables takes "
        "TABLE=PATH (ids=embeddings-ids.npy small=embeddings-small.npy); a table given no "
        "rows starts empty",
    )
    p.add_argument(
        "--keys",
        nargs="+",
        action="extend",
        metavar="KEYS.npy",
        help="with .npy --rows: the keys, int64[n] (keys.npy); several tables: TABLE=KEYS.npy "
        "per table (keys-<table>.npy), each key carrying its table's index",
    )
    p.add_argument(
        "--state",
        nargs="+",
        action="extend",
        metavar="STATE.npy",
        help="with .npy --rows: each row's optimizer state, float32[n, state width]; without "
        "it rows start with the optimizer's initial state; several tables: TABLE=STATE.npy",
    )
    p.add_argument("--key-column", default="key", help="parquet: the key column (key)")
    p.add_argument(
        "--embedding-column",
        default="embedding",
        metavar="NAME",
        help="parquet: a list column NAME, or float columns NAME_0..NAME_<dim-1> (embedding)",
    )
    p.add_argument(
        "--state-column",
        default="state",
        metavar="NAME",
        help="parquet: the optimizer state, as --embedding-column (state; optional)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="rank stores to write (default cluster.n_workers; needed with cluster.address); "
        "a run on another worker count re-shards them when it resumes",
    )
    p.add_argument(
        "--chunk-rows",
        type=positive_int,
        default=None,
        help="rows read, checked and written at a time (default 262144); bounds memory",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a run that run.dir or the stores hold: it is deleted once the import is "
        "complete, and kept if the import fails",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar (as run.quiet)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.epilog = (
        "Writes the rank stores of every table and a checkpoint after 0 passes (pass-000000) "
        "in run.dir; `daskhps train CONFIG --resume` then trains on top of the imported rows."
    )


def run_import(args: argparse.Namespace) -> int:
    from daskhps.importing.job import CHUNK_ROWS, import_tables
    from daskhps.importing.tables import open_sources

    config = load_config(args.config, args.overrides)
    if args.workers is None and not config.cluster.local:
        raise ConfigError(
            f"{config.source}: cluster.address is set, so the worker count is the scheduler's; "
            "give the number of rank stores to write with --workers N"
        )
    sources = open_sources(  # before any input file is opened: TABLE=PATH names a table
        config,
        args.rows,
        keys=args.keys,
        state=args.state,
        key_column=args.key_column,
        embedding_column=args.embedding_column,
        state_column=args.state_column,
    )
    res = import_tables(
        config,
        sources,
        workers=args.workers,
        overwrite=args.overwrite,
        chunk_rows=args.chunk_rows or CHUNK_ROWS,
        progress=not (args.quiet or args.json or config.run.quiet),
    )
    train = ["daskhps", "train", args.config]
    for override in args.overrides:
        train += ["--set", override]
    train.append("--resume")
    if args.json:
        print(json.dumps({**res.to_dict(), "train": shlex.join(train)}, indent=2))
        return 0
    state = {"given": "as given", "initial": "initial", "mixed": "as given for some tables"}
    stores = "rank store(s)" if not res.tables else "rank store(s) per table"
    print(
        f"imported {res.rows:,} rows ({state[res.state]} optimizer state) into {res.workers} "
        f"{stores} in {res.stores_dir} in {res.seconds:.1f} s ({res.rows_per_second:,.0f} "
        f"rows/s); checkpoint {res.checkpoint}"
    )
    for name, t in res.tables.items():
        rows = f"{t['rows']:,} rows" if t["rows"] else "no rows (starts empty)"
        given = " with their optimizer state" if t["optimizer_state"] == "given" else ""
        print(f"  table {name}: {rows}{given}")
    print(f"train on top of them with: {shlex.join(train)}")
    return 0

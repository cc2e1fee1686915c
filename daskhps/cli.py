"""The ``daskhps`` command line.

Each subcommand is a :class:`Command`: a name, a help line, a function that adds its arguments
and a function that runs it and returns an exit status. Later subcommands (``plan``,
``train``, ``predict``, ``inspect``) register the same way in :data:`COMMANDS`.

Errors of daskhps (bad config, bad data) end in one line on stderr and exit status 1, never a
traceback; ``--debug`` shows the traceback when one is wanted.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from daskhps import __version__
from daskhps import _redact as redact
from daskhps.errors import ConfigError, DaskHPSError

__all__ = ["COMMANDS", "Command", "build_parser", "main", "named_command", "script"]

log = logging.getLogger("daskhps")


@dataclass(frozen=True)
class Command:
    """A subcommand: ``add_arguments(parser)`` then ``run(args) -> exit status``."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    # Ctrl-C: what to tell the user (where to resume), instead of a bare "interrupted".
    interrupted: Callable[[argparse.Namespace], str] | None = None
    # Started from the command's words (after its name) before its module is imported.
    early: Callable[[Sequence[str]], None] | None = None


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    return _whole_number(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    return _whole_number(text, 0)


def _generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output folder (day=YYYY-MM-DD/part-* inside)")
    p.add_argument("--days", type=positive_int, default=1, help="number of days (default 1)")
    p.add_argument(
        "--rows-per-day", type=positive_int, default=100_000, help="rows per day (default 1e5)"
    )
    p.add_argument("--parts-per-day", type=positive_int, default=4, help="files per day")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--start-day", default="2024-01-01", help="first day, YYYY-MM-DD")
    p.add_argument("--exponent", type=float, default=1.1, help="power-law exponent (1.1)")
    p.add_argument("--vocab-scale", type=float, default=1.0, help="scales field vocabularies")
    p.add_argument("--signal", type=float, default=1.0, help="strength of the planted signal")
    p.add_argument("--ctr", type=float, default=0.25, help="target click-through rate")
    p.add_argument("--gzip", action="store_true", help="write .tsv.gz parts")
    p.add_argument(
        "--drift",
        type=float,
        default=0.0,
        metavar="RATE",
        help="share of keys replaced by new ones each day, at every popularity (0..1, default 0)",
    )
    p.add_argument(
        "--one-off",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="share of categorical values that are keys seen only once (0..1, default 0)",
    )
    p.add_argument("--workers", type=positive_int, default=None, help="parallel threads")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _generate(args: argparse.Namespace) -> int:
    from daskhps.data.synthetic import GeneratorConfig, generate

    # The flags are the generator's options: checked by its declaration, errors in one line.
    options = {k: getattr(args, k) for k in GeneratorConfig.key_names()}
    cfg = GeneratorConfig.from_dict(options, source="generator")
    summary = generate(
        cfg, args.out, num_workers=args.workers, progress=not args.json and sys.stderr.isatty()
    )
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        print(
            f"wrote {summary.rows:,} rows ({cfg.days} days x {cfg.parts_per_day} parts) to "
            f"{summary.out} in {summary.seconds:.1f} s ({summary.rows_per_second:,.0f} rows/s)"
        )
        print(
            f"CTR {summary.ctr:.4f}; ceiling AUC (true generating function) "
            f"{summary.ceiling_auc:.4f}; details in {summary.out}/generation.json"
        )
    return 0


def _config_arguments(p: argparse.ArgumentParser) -> None:
    """``daskhps config``: a config to print resolved, or ``--schema``."""
    from daskhps.config.arguments import add_config_arguments

    add_config_arguments(p, optional=True)
    p.add_argument(
        "--schema",
        action="store_true",
        help="print the JSON schema of run configs (for editors) instead",
    )


def _config(args: argparse.Namespace) -> int:
    """Print the resolved config (every default filled in) as YAML, or the JSON schema."""
    from daskhps.config.json_schema import render_json_schema
    from daskhps.config.runconfig import load_config

    if args.schema:
        print(render_json_schema(), end="")
        return 0
    if args.config is None:
        raise ConfigError("no CONFIG given: daskhps config CONFIG [--set KEY=VALUE], or --schema")
    print(load_config(args.config, args.overrides).to_yaml(), end="")
    return 0


INSPECT_DAMAGED = 3  # 1 is an error that stopped inspect, 2 a bad command line


def _inspect_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        metavar="PATH",
        help="a run directory or one of its checkpoints, or a retraining folder (its "
        "versions, what each trained on, and the current one)",
    )
    p.add_argument("--json", action="store_true", help="print everything as JSON")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also recompute the sha256 of every store chunk file that has one recorded "
        "(reads every byte; by default file sizes are checked)",
    )
    p.epilog = (
        "Checks every checkpoint's files against its manifest (size, sha256) and every "
        "store segment its commit reads against the store's metadata (size; sha256 with "
        "--verify). Stores not on this machine (on the workers' disks, or another run's at "
        "their path) are read from the run's copy at checkpoint.replicate_to, said in one "
        "line. Exit status: 0 nothing damaged, 1 error (stores neither here nor in a copy), "
        f"{INSPECT_DAMAGED} damage found (each damaged file is named)."
    )


def _inspect(args: argparse.Namespace) -> int:
    from daskhps.runfiles.published import registry_folder
    from daskhps.training.inspection import describe, render

    folder = registry_folder(args.path)
    if folder is None:
        info = describe(args.path, verify=args.verify)
        print(json.dumps(info, indent=2) if args.json else render(info))
        return INSPECT_DAMAGED if info["damaged"] else 0
    # A retraining folder: its versions (what each trained on), then the current one's model.
    from daskhps.retrain.listing import describe_registry, registry_json
    from daskhps.retrain.versions import Registry

    registry = Registry(folder)
    current = registry.current()
    model = describe(current.checkpoint, verify=args.verify) if current else None
    if args.json:
        print(json.dumps({**registry_json(registry), "current_checkpoint": model}, indent=2))
    else:
        print(describe_registry(registry))
        if current is not None and model is not None:
            print(f"current version {current.name}:\n{render(model)}")
    return INSPECT_DAMAGED if model is not None and model["damaged"] else 0


def _workers_early(words: Sequence[str]) -> None:
    """``train`` and ``retrain`` start the fork server of the embedded cluster's workers
    before they import their own code: both take seconds of one core (torch, pandas, Dask),
    and on two cores they overlap. Unless the config names ``cluster.address`` (in its file
    or with ``--set``), or the command only reads the versions; a guess the config's own
    check puts right (``_forkserver.warm_up_for``). A config that cannot be read here is
    left to that check, which says what is wrong with it."""
    import yaml

    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("config", nargs="?")
    peek.add_argument("--set", dest="overrides", action="append", default=[])
    args, rest = peek.parse_known_args(list(words))
    if args.config is None or {"-h", "--help", "--versions", "--dry-run"} & set(rest):
        return
    try:
        with open(args.config, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return
    cluster = raw.get("cluster") if isinstance(raw, dict) else None
    address = cluster.get("address") if isinstance(cluster, dict) else None
    for override in args.overrides:
        key, _, value = override.partition("=")
        if key.strip() == "cluster.address":
            address = yaml.safe_load(value) if value.strip() else None
        elif key.strip() == "cluster" and value.strip():
            return  # a whole section on the command line: left to the config's check
    if address is None:
        from daskhps import _forkserver

        _forkserver.warm_up_early()


def _lazy(
    name: str,
    help: str,
    module: str,
    add: str,
    run: str,
    interrupted: str | None = None,
    early: Callable[[Sequence[str]], None] | None = None,
) -> Command:
    """A command whose module is imported on use: most of them import torch or Dask, which
    ``daskhps generate`` (and ``--help``) do not need."""

    def function(attr: str) -> Callable[..., Any]:
        return getattr(importlib.import_module(module), attr)

    return Command(
        name,
        help,
        lambda p: function(add)(p),
        lambda args: function(run)(args),
        None if interrupted is None else lambda args: function(interrupted)(args),
        early,
    )


COMMANDS: dict[str, Command] = {
    "generate": Command(
        "generate",
        "write synthetic Criteo-format click logs with a known AUC ceiling",
        _generate_arguments,
        _generate,
    ),
    "train": _lazy(
        "train",
        "validate a run config and train (daskhps train CONFIG [--set key=value ...])",
        "daskhps.training.command",
        "add_train_arguments",
        "run_train",
        "train_interrupted",
        early=_workers_early,
    ),
    "config": Command(
        "config",
        "validate a run config and print it with every default filled in, as YAML "
        "(--schema: the JSON schema of run configs)",
        _config_arguments,
        _config,
    ),
    "inspect": Command(
        "inspect",
        "what a checkpoint (or a run's checkpoints) holds, and whether any file is damaged",
        _inspect_arguments,
        _inspect,
    ),
    "report": _lazy(
        "report",
        "write the run report (HTML with the plots inline, and PNGs) of a run directory",
        "daskhps.monitor.command",
        "add_report_arguments",
        "run_report",
    ),
    "predict": _lazy(
        "predict",
        "score click logs with a model version through the read-only hierarchy, to parquet",
        "daskhps.serve.commands",
        "add_predict_arguments",
        "run_predict",
    ),
    "serve": _lazy(
        "serve",
        "an HTTP endpoint that scores rows online, following the published version",
        "daskhps.serve.commands",
        "add_serve_arguments",
        "run_serve",
    ),
    "export": _lazy(
        "export",
        "write a model as TorchScript beside an embedding dump, for serving outside daskhps",
        "daskhps.serve.commands",
        "add_export_arguments",
        "run_export",
    ),
    "import": _lazy(
        "import",
        "load existing embeddings as a new run's table (then: daskhps train CONFIG --resume)",
        "daskhps.importing.command",
        "add_import_arguments",
        "run_import",
    ),
    "retrain": _lazy(
        "retrain",
        "train on new complete log days and publish if the guard holds (cron-friendly exit codes)",
        "daskhps.retrain.command",
        "add_retrain_arguments",
        "run_retrain",
        early=_workers_early,
    ),
    "plan": _lazy(
        "plan",
        "size a run before it starts: memory per tier per worker, pass working set, disk",
        "daskhps.capacity.command",
        "add_plan_arguments",
        "run_plan",
    ),
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``daskhps ARGV``: every command's name and help line, and the arguments
    of the command ``argv`` names (of every command when ``argv`` is None). Adding a
    command's arguments imports its module, and most import torch and Dask: seconds that
    ``daskhps --help`` or ``daskhps generate`` would otherwise spend on commands not run."""
    parser = argparse.ArgumentParser(
        prog="daskhps", description="Hierarchical parameter server on Dask for CTR models."
    )
    parser.add_argument("--version", action="version", version=f"daskhps {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    named = None if argv is None else named_command(argv)
    for cmd in COMMANDS.values():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if argv is None or cmd.name == named:
            cmd.add_arguments(p)
    return parser


def named_command(argv: Sequence[str]) -> str | None:
    """The command ``daskhps ARGV`` runs, or None: the first word that is not an option,
    since none of the options before the command takes a value."""
    return next((a for a in argv if not a.startswith("-")), None)


def _dask_warnings_only(record: logging.LogRecord) -> bool:
    """Dask logs its embedded cluster's life at INFO (each worker registered, each client
    connection, the close: 50 lines a run between the user and the progress bar); its
    warnings and errors still show. A filter on the handler, since importing distributed
    sets its loggers' levels from Dask's config, later than this runs."""
    return record.levelno >= logging.WARNING or not record.name.startswith("distributed")


def main(argv: Sequence[str] | None = None) -> int:
    """``daskhps ARGV`` (the script's own command line when ``argv`` is None, see
    :func:`script`); returns the exit status."""
    script = argv is None  # a process of its own, with its imports ahead of it
    argv = sys.argv[1:] if argv is None else list(argv)
    named = COMMANDS.get(named_command(argv) or "")
    if script and named is not None and named.early is not None:
        named.early(argv[argv.index(named.name) + 1 :])
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if args.verbose < 2:  # -vv shows everything
        for handler in logging.getLogger().handlers:
            handler.addFilter(_dask_warnings_only)
    redact.install()  # at every verbosity: -vv prints the store clients' signed requests
    try:
        return COMMANDS[args.command].run(args)
    except DaskHPSError as e:
        if args.debug:
            raise
        print(f"daskhps {args.command}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # disk full, permission denied: the user's to fix, not a bug
        if args.debug:
            raise
        print(f"daskhps {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        say = COMMANDS[args.command].interrupted
        print(f"daskhps {args.command}: {say(args) if say else 'interrupted'}", file=sys.stderr)
        return 130


def script() -> NoReturn:
    """The ``daskhps`` script, and ``python -m daskhps.cli``: :func:`main`, then exit."""
    code = main()
    # The interpreter's exit searches every object still alive for cycles, torch's and Dask's
    # among them: 1.3 s of the 1.6 s from the end of a run to the prompt, measured. Frozen,
    # they are still freed as their modules go, without that search.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    script()

"""``daskhps report RUN_DIR``: write the run report of a (finished or running) training run."""

from __future__ import annotations

import argparse

__all__ = ["add_report_arguments", "run_report"]


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (run.dir of the config)")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR/report)")
    p.add_argument(
        "--ceiling-auc", type=float, default=None, help="AUC ceiling to draw (default: found)"
    )


def run_report(args: argparse.Namespace) -> int:
    from daskhps.monitor.report import write_report

    page = write_report(args.run_dir, args.out, ceiling_auc=args.ceiling_auc)
    print(page)
    return 0

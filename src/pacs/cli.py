"""The `pacs` command line: `pacs eval ...`, `pacs demo ...`, `pacs plan ...` (like `trl grpo`, one script with
subcommands).

Each subcommand lives in its own module, which exposes `add_parser(subparsers)` and registers a `func` that takes
the parsed `argparse.Namespace`; heavy imports happen inside `func`, so `pacs --help` stays fast. A subcommand that
sets `accepts_overrides=True` receives the arguments it does not know as `overrides` (`pacs plan` passes them on to
the recipe, as on train_qwen.py's command line); any other subcommand refuses them.
"""

from __future__ import annotations

import argparse
import logging
import sys


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .demo import add_parser as add_demo_parser
    from .eval.cli import add_parser as add_eval_parser
    from .plan import add_parser as add_plan_parser

    parser = argparse.ArgumentParser(prog="pacs", description="PACS for RLVR on TRL.")
    parser.add_argument("--version", action="version", version=f"pacs {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="{eval,demo,plan}")
    add_eval_parser(subparsers)
    add_demo_parser(subparsers)
    add_plan_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, overrides = parser.parse_known_args(argv)
    if overrides and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(overrides)}")
    args.overrides = overrides
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

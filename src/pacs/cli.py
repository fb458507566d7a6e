"""The `pacs` command line: `pacs eval ...`, `pacs demo ...` (like `trl grpo`, one script with subcommands).

Each subcommand lives in its own module, which exposes `add_parser(subparsers)` and registers a `func` that takes
the parsed `argparse.Namespace`; heavy imports happen inside `func`, so `pacs --help` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import sys


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .demo import add_parser as add_demo_parser
    from .eval.cli import add_parser as add_eval_parser

    parser = argparse.ArgumentParser(prog="pacs", description="PACS for RLVR on TRL.")
    parser.add_argument("--version", action="version", version=f"pacs {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="{eval,demo}")
    add_eval_parser(subparsers)
    add_demo_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""The `pacs` command line: `pacs train ...`, `pacs plan ...`, `pacs recipes`, `pacs eval ...`, `pacs demo ...` (like
`trl grpo`, one script with subcommands); `python -m pacs` is the same.

Each subcommand lives in its own module, which exposes `add_parser(subparsers)` and registers a `func` that takes
the parsed `argparse.Namespace`; heavy imports happen inside `func`, so `pacs --help` stays fast. A subcommand that
sets `accepts_overrides=True` receives its whole command line as `overrides` and reads it itself: `train`, `plan`,
`eval` and `demo` read their options from dataclasses with one parser class, `pacs.options.CommandParser` (TRL's
`TrlParser`: options spelled with underscores as TRL spells them, the dash spellings accepted too); `recipes` takes no
option. Every ordinary mistake of every subcommand is reported here, once, by `pacs.options.run_command` (`pacs
<command>: error: <message>`, exit 2); a name that is not known gets the closest known ones from
`pacs.options.did_you_mean`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .options import run_command


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .demo import add_parser as add_demo_parser
    from .eval.cli import add_parser as add_eval_parser
    from .plan import add_parser as add_plan_parser
    from .recipes import add_parser as add_recipes_parser

    parser = argparse.ArgumentParser(prog="pacs", description="PACS for RLVR on TRL.")
    parser.add_argument("--version", action="version", version=f"pacs {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="{train,plan,recipes,eval,demo}")
    _add_train_parser(subparsers)
    add_plan_parser(subparsers)
    add_recipes_parser(subparsers)
    add_eval_parser(subparsers)
    add_demo_parser(subparsers)
    return parser


def _add_train_parser(subparsers) -> None:
    """`pacs train`: registered here, so that `pacs --help` does not import TRL; `pacs.train.train_command` reads
    the whole command line after `train`, once."""
    parser = subparsers.add_parser(
        "train",
        add_help=False,  # `pacs train --help` is the recipe parser's: every training argument, from its dataclasses
        allow_abbrev=False,
        help="Train with PACS (or the GRPO baseline) from a recipe: `pacs train --config qwen3_4b_pacs`.",
    )
    parser.set_defaults(func=_run_train, accepts_overrides=True)


def _run_train(args) -> int:
    from .train import train_command

    return train_command(args.overrides)


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
    return run_command(f"pacs {args.command}", lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())

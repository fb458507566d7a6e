"""One way to read a command line: every `pacs` subcommand (`train`, `plan`, `eval`, `demo`) reads its options from
dataclasses with [`CommandParser`], TRL's `TrlParser` (itself transformers' `HfArgumentParser`), as `trl grpo` does.

- Options are spelled as the fields are, with underscores (`--max_new_tokens`), as TRL's command line spells them; the
  dash spelling (`--max_new_tokens`) is accepted too, as `HfArgumentParser` accepts it.
- No abbreviations: `--num_generation` is a typo to name, not `--num_generations`.
- An error is one line: the parser raises `ValueError`, and [`run_command`] prints it as `<prog>: error: ...` and
  exits 2, the same for every subcommand and for every refusal before the work starts (`USER_ERRORS`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from trl import TrlParser


__all__ = ["USER_ERRORS", "CommandParser", "run_command"]

USER_ERRORS = (ValueError, FileNotFoundError)
"""What an ordinary mistake raises before the work starts (an option, recipe, key or value; a model, data file,
column, reward or checkpoint that does not exist): the command prints its message, exit 2, no traceback."""


class CommandParser(TrlParser):
    """`TrlParser` over a subcommand's dataclasses, without abbreviations, whose errors are a one-line `ValueError`
    (not argparse's usage and `SystemExit`): [`run_command`] prints it."""

    def __init__(self, dataclass_types, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(dataclass_types, **kwargs)

    def error(self, message: str):
        raise ValueError(f"{message} (`{self.prog} --help` lists every option)")


def run_command(prog: str, func: Callable[[], int | None]) -> int:
    """`func()`'s exit code, or 2 with `<prog>: error: <message>` on stderr (one line) for an ordinary mistake."""
    try:
        return int(func() or 0)
    except USER_ERRORS as error:
        print(f"{prog}: error: {error}", file=sys.stderr)  # the command's own output, as argparse's errors
        return 2

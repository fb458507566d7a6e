"""The `pacs` command line's one module: how every subcommand (`train`, `plan`, `eval`, `demo`, `recipes`) and the
training script (`python -m pacs.train`, `examples/train_qwen.py`) read options and report mistakes.

- [`CommandParser`]: TRL's `TrlParser` (itself transformers' `HfArgumentParser`) over a subcommand's dataclasses, as
  `trl grpo` reads its options. Options are spelled as the fields are, with underscores (`--max_new_tokens`), as TRL's
  command line spells them; the dash spelling is accepted too, as `HfArgumentParser` accepts it. No abbreviations:
  `--num_generation` is a typo to name, not `--num_generations`.
- [`did_you_mean`]: the one "did you mean" of every message (unknown keys, options, recipes, configs, algorithms).
- [`unknown_options_error`]: the one message for keys or options that no dataclass declares.
- [`run_command`]: the one error reporter. An ordinary mistake (`USER_ERRORS`: an option, recipe, key or value; a
  model, data file, column, reward or checkpoint that does not exist) is printed as `<prog>: error: <message>`, one
  line on stderr as argparse's own errors, and the command exits 2.

This module imports neither TRL nor torch (so that `pacs --help` stays fast): `CommandParser` is built on first use,
as `pacs.PACSConfig` is.
"""

from __future__ import annotations

import difflib
import logging
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from trl import TrlParser

logger = logging.getLogger(__name__)

__all__ = ["USER_ERRORS", "CommandParser", "did_you_mean", "field_options", "run_command", "unknown_options_error"]

CommandParser: type[TrlParser]  # built on first use (`__getattr__` below): TRL's parser, without abbreviations

USER_ERRORS = (ValueError, FileNotFoundError)
"""What an ordinary mistake raises before the work starts (an option, recipe, key or value; a model, data file,
column, reward or checkpoint that does not exist): the command prints its message, exit 2, no traceback."""


def did_you_mean(name: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    """`"did you mean a or b?"` naming the (up to three) entries of `known` closest to `name`, or `""` when none is
    close: the one "did you mean" of every `pacs` message.

    >>> did_you_mean("learnig_rate", ["learning_rate", "lr_scheduler_type", "seed"])
    'did you mean learning_rate?'
    >>> did_you_mean("xyz", ["learning_rate"])
    ''
    """
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=cutoff)
    return f"did you mean {' or '.join(close)}?" if close else ""


def field_options(dataclass_types: Iterable[type]) -> list[str]:
    """The option names (`learning_rate`, without dashes) that `CommandParser` makes of `dataclass_types`: one per
    field, in the underscore spelling that recipes and TRL's command line use."""
    import dataclasses

    return [f.name for dtype in dataclass_types for f in dataclasses.fields(dtype) if f.init]


def unknown_options_error(unknown: Iterable[tuple[str, ...]], known: Iterable[str], what: str) -> ValueError:
    """The one error for keys or options that nothing declares. `unknown` holds `(key, where)` pairs, or `(key, where,
    advice)` where a fix is known (`("--lerning_rate", "on the command line")`); `known` holds the valid names (without
    dashes) and `what` says what the keys are not. Each unknown key gets a line naming the closest valid ones.

    >>> print(unknown_options_error([("--lerning_rate", "on the command line")], ["learning_rate"], "an option"))
    Unknown key(s), not an option:
      lerning_rate (on the command line): did you mean learning_rate?
    """
    known = sorted(set(known))
    lines = []
    for key, where, *advice in unknown:
        name = key.lstrip("-").split("=")[0]
        lines.append(f"  {name} ({where}): {advice[0] if advice else did_you_mean(name, known) or 'no similar key.'}")
    return ValueError(f"Unknown key(s), not {what}:\n" + "\n".join(lines))


def run_command(prog: str, func: Callable[[], int | None]) -> int:
    """`func()`'s exit code, or 2 with `<prog>: error: <message>` on stderr for an ordinary mistake (`USER_ERRORS`);
    a message of several lines (unknown keys, one per line) keeps its lines."""
    try:
        return int(func() or 0)
    except USER_ERRORS as error:
        logger.debug("%s: the traceback of the error below", prog, exc_info=True)  # for whoever debugs pacs itself
        print(f"{prog}: error: {error}", file=sys.stderr)  # the command's own output, as argparse's errors
        return 2


def _command_parser_class() -> type[TrlParser]:
    from trl import TrlParser

    class CommandParser(TrlParser):
        """`TrlParser` over a subcommand's dataclasses, without abbreviations, whose errors are a one-line `ValueError`
        (not argparse's usage and `SystemExit`): [`run_command`] prints it."""

        def __init__(self, dataclass_types, **kwargs):
            kwargs.setdefault("allow_abbrev", False)
            super().__init__(dataclass_types, **kwargs)

        def error(self, message: str):
            raise ValueError(f"{message} (`{self.prog} --help` lists every option)")

    CommandParser.__module__, CommandParser.__qualname__ = __name__, "CommandParser"
    return CommandParser


_lazy: dict[str, type] = {}


def __getattr__(name: str):
    # `CommandParser` subclasses TRL's parser: built on first use, so that importing this module imports no TRL
    if name == "CommandParser":
        if name not in _lazy:
            _lazy[name] = _command_parser_class()
        return _lazy[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
